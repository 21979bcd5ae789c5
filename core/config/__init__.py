"""What a run is asked to do: the TrainConfig spec (one declaration per field, from which the
CLI flags, the form and validation are derived), each training method's declaration
(core.config.methods: its fields, checks, data kind, plots; read by every layer above),
presets, migrations of older configs and the recipe defaults. May import `core.platform`."""
