"""What a run is asked to do: the TrainConfig spec (one declaration per field, from which the
CLI flags, the form and validation are derived), presets, migrations of older configs and the recipe
defaults. May import `core.platform`."""
