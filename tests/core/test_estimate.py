import dataclasses

import torch

from core.config import presets
from core.config.spec import TrainConfig, validate
from core.models.model import GPT, GPTConfig
from core.models.params import param_count
from core.training import optim
from core.training.estimate import GB, estimate, flops_per_token
from core.training.planner import fit_micro_batch, recommend_preset


def cfg(**kw):
    return validate(TrainConfig(**kw))


def test_optimizer_state_bytes_are_exact():
    c = cfg(hidden_dim=48, n_layers=2, n_heads=4, seq_len=32, arch="gpt2", optimizer="adamw")
    model = GPT(GPTConfig(hidden_dim=48, n_layers=2, n_heads=4, seq_len=32))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward()
    opt.step()
    state_bytes = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for k, t in s.items()
        if k in ("exp_avg", "exp_avg_sq")
    )
    est = estimate(c)
    assert est.optimizer == state_bytes
    assert est.weights == est.gradients == 4 * model.num_params() == 4 * est.n_params


def test_muon_state_bytes_are_exact():
    c = cfg(hidden_dim=48, n_layers=2, n_heads=4, seq_len=32, optimizer="muon")
    model = GPT(GPTConfig.from_train(c))
    opt = optim.make(model, c)
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward()
    for o in opt.all:
        o.step()
    state_bytes = sum(
        t.numel() * t.element_size()
        for o in opt.all
        for s in o.state.values()
        for k, t in s.items()
        if k in ("exp_avg", "exp_avg_sq", "momentum_buffer")
    )
    assert estimate(c).optimizer == state_bytes < 8 * model.num_params()


def test_flops_per_token_follows_6n_plus_attention():
    c = cfg(hidden_dim=64, n_layers=3, n_heads=4, seq_len=128, arch="gpt2")
    non_embedding = param_count(64, 3, 128) - 128 * 64
    assert flops_per_token(c) == 6 * non_embedding + 12 * 3 * 64 * 128


def test_each_dimension_grows_the_estimate_the_expected_way():
    base = cfg(hidden_dim=256, n_layers=4, n_heads=4, seq_len=256, batch_size=8)
    act = estimate(base).activations
    twice_batch = estimate(dataclasses.replace(base, batch_size=16)).activations
    assert 1.9 * act < twice_batch <= 2 * act  # activations are linear in the micro-batch
    assert estimate(dataclasses.replace(base, seq_len=512)).activations > 1.9 * act
    assert estimate(dataclasses.replace(base, n_layers=8)).activations > 1.6 * act
    wider = estimate(dataclasses.replace(base, hidden_dim=512))
    assert wider.activations > 1.9 * act and wider.n_params > 3.5 * estimate(base).n_params
    # Flash attention: more heads cost nothing extra on a GPU, nor on the CPU without dropout
    # (its flash kernel); with dropout the CPU's math kernel keeps T x T scores per head.
    more_heads = dataclasses.replace(base, n_heads=8)
    assert estimate(more_heads).activations == act
    plain, drop = dataclasses.replace(base, dropout=0.0), dataclasses.replace(base, dropout=0.1)
    cpu = lambda c, **kw: estimate(dataclasses.replace(c, **kw), on_gpu=False).activations  # noqa: E731
    assert cpu(plain, n_heads=8) == cpu(plain)
    assert cpu(drop, n_heads=8) > cpu(drop) > cpu(plain)
    # Checkpointing trades memory for compute; fp32 activations are larger than bf16.
    deep = dataclasses.replace(base, n_layers=12)
    ckpt = estimate(dataclasses.replace(deep, grad_checkpointing=True)).activations
    assert ckpt < estimate(deep).activations / 3
    assert estimate(base, precision="fp32").activations > 1.5 * act
    assert estimate(base, precision="fp32").weight_casts == 0 < estimate(base).weight_casts
    # The device total adds the CUDA context and allocator slack on top of the live peak.
    e = estimate(base)
    assert e.device_total > e.allocator_peak + e.cuda_context


def test_recommendation_for_simulated_cards():
    expected = {
        4: "gpu-small",
        8: "gpu-8gb",
        12: "gpu-12gb",
        16: "gpu-16gb",
        24: "gpu-24gb",
        48: "gpu-48gb",
        80: "gpu-80gb",
    }
    got = {gb: recommend_preset(gb * GB, gb * GB * 0.97).name for gb in expected}
    assert got == expected
    # An 80 GB card that is mostly busy gets a preset that fits what is free.
    busy = recommend_preset(80 * GB, 8 * GB)
    assert busy.name == "gpu-8gb"
    assert estimate(presets.to_config(busy)).device_total < 8 * GB * 0.9


def test_without_a_gpu_the_cpu_preset_is_recommended(monkeypatch):
    monkeypatch.setattr("core.platform.hardware.gpus", lambda: [])
    assert recommend_preset().name == "cpu"


def test_fit_to_gpu_keeps_the_effective_batch_and_picks_the_largest_that_fits():
    big = presets.to_config(presets.load_preset("gpu-80gb"))
    free = 16 * GB
    fitted = fit_micro_batch(big, free)
    assert fitted.batch_size * fitted.grad_accum == big.batch_size * big.grad_accum
    assert estimate(fitted).device_total <= free * 0.9
    bigger = dataclasses.replace(
        fitted, batch_size=fitted.batch_size * 2, grad_accum=fitted.grad_accum // 2
    )
    assert fitted.batch_size == big.batch_size or estimate(bigger).device_total > free * 0.9
    assert fit_micro_batch(big, 1 * GB) is None  # not even one sequence fits in 1 GB


def test_a_fine_tunes_estimate_follows_what_it_keeps_and_the_cpus_checkpoint_copy(tmp_path):
    """A fine-tune's model remakes its norms' and SwiGLU's outputs (fewer activations than a
    new model of its shape); on the CPU a checkpoint's copy of weights and AdamW moments lies
    in the same memory, and with checkpointing it is the peak (docs/performance.md)."""
    import json

    shape = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(shape))
    run = dict(seq_len=64, batch_size=1, grad_accum=1, device="cpu", precision="fp32")
    tuned = cfg(
        init_from=str(tmp_path),
        tokenizer="model",
        hidden_dim=256,
        n_layers=4,
        n_heads=4,
        bias=False,
        **run,
    )
    new = dataclasses.replace(tuned, init_from=None, tokenizer="bytes", arch="llama")
    assert estimate(tuned, on_gpu=False).activations < estimate(new, on_gpu=False).activations
    ckpt = estimate(dataclasses.replace(tuned, grad_checkpointing=True), on_gpu=False)
    assert ckpt.snapshot == 4 * ckpt.n_params + ckpt.optimizer  # full: weights + moments
    assert ckpt.snapshot > ckpt.activations + ckpt.logits  # so the copy sets the peak
    parts = ckpt.weights + ckpt.gradients + ckpt.optimizer + ckpt.weight_casts
    assert ckpt.allocator_peak == parts + ckpt.snapshot
    assert estimate(tuned, on_gpu=True).snapshot == 0  # on a GPU the copy is in host RAM
    lora = estimate(dataclasses.replace(tuned, lora_rank=8), on_gpu=False)
    assert lora.snapshot == 4 * lora.trained + lora.optimizer  # adapters only


def test_the_peak_by_component_adds_up_to_the_device_total():
    """The window's Details and benchmarks/long_context.py show the estimate in the measured
    profile's components; they are the same peak, split."""
    from core.training import memory_profile as mp

    for kw in (
        dict(seq_len=4096, grad_checkpointing=True),  # CPU: a block's backward sets the peak
        dict(seq_len=256),  # CPU: the loss's backward sets the peak
        dict(seq_len=256, batch_size=8, dropout=0.1),
    ):
        c = cfg(hidden_dim=64, n_layers=4, n_heads=2, arch="llama", device="cpu", **kw)
        for on_gpu in (False, True):
            est = estimate(c, on_gpu=on_gpu)
            parts = dict(est.components())
            assert sum(parts.values()) == est.device_total, (kw, on_gpu)
            assert set(parts) <= set(mp.ORDER)
            assert parts[mp.WEIGHTS] == est.weights + est.weight_casts
