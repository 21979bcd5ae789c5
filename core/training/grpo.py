"""GRPO (Group Relative Policy Optimization) with verifiable rewards, as TRL's GRPOTrainer:

- each step draws batch_size x grad_accum prompts and samples num_generations (G) completions
  of each, all G x B as one batch with the KV cache (temperature, top-p, the end of turn);
- the reward functions (core.training.rewards) score them; a completion's advantage is its
  reward minus its group's mean, divided by the group's std (scale_rewards group), the
  batch's (batch) or nothing (none: Dr. GRPO);
- the loss is the clipped policy loss over completion tokens, -min(r A, clip(r, 1-eps, 1+eps)
  A) with r = p / p_old, plus beta x the k3 KL estimate to the reference, normalized as TRL's
  loss_type (grpo: per sequence; bnpo: per micro-batch token; dr_grpo: by rows x
  max_completion_tokens; dapo: by the step's completion tokens). One optimizer step per
  generation, as TRL's default: p_old is p detached, r is 1 with the gradient of p.

The sampling generator is seeded by the run's seed and the step, so an out-of-memory retry and
a resumed run draw the same completions. The metrics carry TRL's names.
"""

from __future__ import annotations

import copy
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple

import torch

from core.config.methods import grpo as declared
from core.config.spec import TrainConfig
from core.models import lora
from core.models.loss import chunk_positions, token_logps
from core.models.model import cache_bytes
from core.platform.device import is_oom
from core.runs.folder import drop_records_past
from core.training.objectives import Objective, StepSignals
from core.training.rewards import Rewards, check_columns, text_of
from core.training.state import RunState
from core.training.steps import autocast, to_device

LOSS_SUMS = (
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "tokens",
)
TABLE_ROWS = 64  # sampled completions kept per step in completions.jsonl
TABLE_CHARS = 2000


# -- sampling ---------------------------------------------------------------------------------


def _pick(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor):
    """Sample by the inverse CDF: row r takes the token where its cumulative probability
    passes u[r] (uniform in [0, 1)). A row's token depends on its own logits and u alone, so
    sampling the rows in smaller batches (after an out-of-memory error) draws the same.
    Temperature 0: the likeliest token (greedy)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    order, kept = None, None
    if top_p < 1.0:  # the smallest set of likeliest tokens reaching top_p (the first stays)
        probs, order = torch.sort(probs, descending=True, dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs >= top_p
        probs = probs.masked_fill(drop, 0.0)
        kept = (~drop).sum(dim=-1, keepdim=True)
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:]
    x = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    index = torch.searchsorted(cdf, x, right=True)  # the first token whose cdf passes x
    index = index.clamp(max=probs.shape[-1] - 1) if kept is None else torch.minimum(index, kept - 1)
    return index[:, 0] if order is None else order.gather(1, index)[:, 0]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask): the prompts right-aligned, so every row's next token is in one column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = True
    return ids, mask


class Samples(NamedTuple):
    """Completions sampled after prompts, one row each."""

    prompt_ids: torch.Tensor  # (N, P) left-padded
    prompt_mask: torch.Tensor  # (N, P) False over the padding
    completions: torch.Tensor  # (N, C) padded with pad after the stop token
    completion_mask: torch.Tensor  # (N, C) up to and with the stop token
    terminated: torch.Tensor  # (N,) ended at a stop token


@torch.no_grad()
def sample(
    model,
    prompts: list[list[int]],
    n_new: int,
    temperature: float,
    top_p: float,
    stop_ids,
    pad: int,
    uniforms: torch.Tensor,
    device,
    precision: str,
    images=None,
) -> Samples:
    """Sample a completion after each prompt, all rows as one batch through the model's own
    cached forward (GPT.forward_cached); row r's token t is drawn with uniforms[r, t]
    (N, n_new), or is the likeliest at temperature 0. images: the rows' images in order (the
    forward's images=), seen in the prefill (Qwen's M-RoPE positions go on after them
    through the cache's rope_delta)."""
    was_training = model.training
    model.eval()
    ids, valid = left_padded(prompts, pad)
    ids, valid = ids.to(device), valid.to(device)
    n = ids.shape[0]
    stops = torch.tensor(list(stop_ids) or [-1], device=device)
    out = torch.full((n, n_new), pad, dtype=torch.long, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    try:
        with autocast(device, precision):
            logits, cache = model.forward_cached(ids, None, valid, last=True, images=images)
            for t in range(n_new):
                nxt = _pick(logits, temperature, top_p, uniforms[:, t])
                nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
                out[:, t] = nxt
                done = done | torch.isin(nxt, stops)
                if bool(done.all()) or t == n_new - 1:
                    break
                logits, cache = model.forward_cached(nxt[:, None], cache, last=True)
    finally:
        model.train(was_training)
    is_stop = torch.isin(out, stops)
    first = torch.where(
        is_stop.any(1), is_stop.float().argmax(1), torch.full_like(done, n_new, dtype=torch.long)
    )
    index = torch.arange(out.shape[1], device=device)
    completion_mask = index[None, :] <= first[:, None]
    completion_mask &= index[None, :] < n_new
    return Samples(ids, valid, out, completion_mask, is_stop.any(1))


def joined(parts: list[Samples], pad: int) -> Samples:
    """The samples of several batches as one: the prompts left-padded to the widest."""
    width = max(part.prompt_ids.shape[1] for part in parts)
    n = sum(part.prompt_ids.shape[0] for part in parts)
    device = parts[0].prompt_ids.device
    ids = torch.full((n, width), pad, dtype=torch.long, device=device)
    valid = torch.zeros((n, width), dtype=torch.bool, device=device)
    row = 0
    for part in parts:
        rows, w = part.prompt_ids.shape
        ids[row : row + rows, width - w :] = part.prompt_ids
        valid[row : row + rows, width - w :] = part.prompt_mask
        row += rows
    return Samples(
        ids,
        valid,
        torch.cat([part.completions for part in parts]),
        torch.cat([part.completion_mask for part in parts]),
        torch.cat([part.terminated for part in parts]),
    )


# -- advantages and the loss ------------------------------------------------------------------


def nanstd(x: torch.Tensor, dim=None) -> torch.Tensor:
    """The unbiased std ignoring NaN (TRL's nanstd)."""
    mean = torch.nanmean(x, dim=dim, keepdim=dim is not None)
    count = (~torch.isnan(x)).sum(dim=dim) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nansum((x - mean) ** 2, dim=dim) / (count - 1)
    return var.sqrt()


class Advantages(NamedTuple):
    """TRL's sum_then_normalize of a step's rewards, one value a completion (N,)."""

    advantages: torch.Tensor
    rewards: torch.Tensor  # the functions' weighted sum (NaN: none applied)
    std: torch.Tensor  # of the group's (or the batch's) rewards
    zero_std: torch.Tensor  # the rewards alike: nothing to learn from


def advantages(per_func: torch.Tensor, weights: torch.Tensor, group: int, scale: str):
    """TRL's sum_then_normalize of (N, F) rewards (NaN where a function did not apply) in
    groups of `group` rows."""
    unscorable = torch.isnan(per_func).all(dim=1)
    rewards = (per_func * weights[None, :]).nansum(dim=1)
    rewards[unscorable] = math.nan
    mean = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else rewards * 0
    else:  # group; none: the std only says which groups are all alike
        std = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    zero_std = torch.isclose(std, torch.zeros_like(std))
    return Advantages(torch.nan_to_num(adv, nan=0.0), rewards, std, zero_std)


def policy_loss(logps, old_logps, ref_logps, adv, mask, cfg: TrainConfig, n_items: float):
    """TRL's per-token clipped loss and its normalization by loss_type, for one micro-batch;
    returns (loss as the trainer divides it by grad_accum, per-token KL or None, ratio).
    n_items: the completion tokens of the whole step (dapo)."""
    mask = mask.float()
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon)
    a = adv[:, None]
    per_token = -torch.min(ratio * a, clipped * a)
    kl = None
    if cfg.grpo_beta != 0.0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = per_token + cfg.grpo_beta * kl
    if cfg.loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif cfg.loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif cfg.loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * cfg.max_completion_tokens)
    else:  # dapo: over the step's tokens; the trainer's division by grad_accum is undone
        loss = (per_token * mask).sum() / max(n_items, 1.0) * cfg.grad_accum
    return loss, kl, ratio


# -- the objective ----------------------------------------------------------------------------


@dataclass
class Rollout:
    """One micro-batch's rows: prompt and completion ids, masks and advantages."""

    ids: torch.Tensor  # (n, P + C)
    segments: torch.Tensor  # (n, P + C): 0 over the left padding, 1 over the row
    prompt_width: int
    completion_mask: torch.Tensor  # (n, C)
    advantages: torch.Tensor  # (n,)
    n_items: float  # the step's completion tokens (dapo's normalizer)
    images: object = None  # the rows' images in order (the forward's images=), if any


class GRPO(Objective):
    name = declared.METHOD.name  # fields, checks, plots: core/config/methods/grpo.py

    def __init__(self, cfg: TrainConfig):
        self.rewards: Rewards | None = None
        self.reference = None  # beta > 0: a frozen copy of a full fine-tune's start
        self.folder = None
        self.latest: list[dict] = []  # the latest step's completions and their rewards
        self.sample_rows: int | None = None  # completions sampled at once (None: a step's)
        self.main = True
        self.log = lambda message: None  # the run's log, from prepare
        self._tokens = 0  # the latest step's prompt and completion tokens
        self._gen: dict = {}  # the latest step's sampling metrics (TRL's names)
        self._table_started = False

    def check(self, cfg: TrainConfig) -> None:
        """The reward functions, imported before any data or model is touched."""
        self.rewards = Rewards(cfg)

    def load_data(
        self,
        cfg: TrainConfig,
        pretrained,
        saved: dict | None,
        *,
        cache,
        allow_change: bool,
        events,
        stop,
        log,
    ):
        """The prompt file, read and tokenized (it is small: no cache)."""
        from core.training.inputs import prepare_prompts

        return prepare_prompts(cfg, pretrained, saved, allow_change, log)

    def check_data(self, data) -> None:
        """The prompts have the columns the built-in rewards read: before the model loads."""
        check_columns(self.rewards.funcs, data.columns)

    def prepare(self, run: RunState, cfg: TrainConfig, log, events, stop) -> None:
        self.folder, self.log = run.folder, log
        self.main = run.world.main  # the completions table is the main process's to write
        if cfg.grpo_beta and not cfg.lora_rank:  # the starting weights, kept frozen
            self.reference = copy.deepcopy(run.model).eval().requires_grad_(False)
        names = ", ".join(self.rewards.names)
        log(
            f"grpo: {cfg.num_generations} completions per prompt, up to "
            f"{cfg.max_completion_tokens} tokens; rewards {names}; loss {cfg.loss_type}, "
            f"beta {cfg.grpo_beta:g}"
        )

    @staticmethod
    def extra_memory(cfg: TrainConfig, c, act_bytes: int, weight_bytes: int):
        """(generation, logits, reference) bytes: sampling holds the KV cache of all G x B
        completions and their last logits; the loss makes the completion positions' logits
        one chunk at a time (core.models.loss.token_logps: in fp32 LinearTokenLogps's two
        blocks; else a checkpointed chunk's logits, their fp32 copy, log-softmax, its exp for
        the entropy, and in the backward the remade chunk and its gradient); beta > 0 in a
        full fine-tune keeps a frozen copy of the starting weights."""
        rows = cfg.batch_size * cfg.grad_accum * cfg.num_generations
        kv = cache_bytes(c, rows, cfg.seq_len, act_bytes)  # a DeltaNet layer: its state
        generation = kv + rows * c.vocab_size * 4 * 3 + rows * cfg.seq_len**2  # + prefill mask
        positions = cfg.batch_size * cfg.num_generations * cfg.max_completion_tokens
        if act_bytes == 4 and not c.logit_softcap:  # LinearTokenLogps: two fp32 blocks
            chunk = chunk_positions(c.vocab_size, fused=True, hidden_dim=c.hidden_dim)
            logits = min(positions, chunk) * c.vocab_size * 8
        else:  # checkpointed chunks: logits, fp32, log-softmax, exp, grad
            chunk = min(positions, chunk_positions(c.vocab_size))
            logits = chunk * c.vocab_size * (act_bytes + 4 * 4)
        reference = weight_bytes if cfg.grpo_beta and not cfg.lora_rank else 0
        return generation, logits, reference

    # -- a step -------------------------------------------------------------------------------

    def generator(self, cfg: TrainConfig, step: int, device) -> torch.Generator:
        """The step's own sampling generator: a retry or a resumed run draws the same."""
        gen = torch.Generator(device=device)
        return gen.manual_seed((cfg.seed * 1_000_003 + step) % 2**63)

    def micro_batches(self, run: RunState, cfg: TrainConfig, starts, step: int) -> list:
        """Sample, score and weigh the step's completions; the rows in micro-batches of
        batch_size prompts' G completions."""
        data, tok, g, world = run.data, run.data.tokenizer, cfg.num_generations, run.world
        index = [int(i) for i in starts for _ in range(g)]
        gen = self.generator(cfg, step, run.device)
        drawn_now = self._sample(run, cfg, index, gen, step, world)
        out, mask, ended = drawn_now.completions, drawn_now.completion_mask, drawn_now.terminated
        prompt_ids, prompt_mask = drawn_now.prompt_ids, drawn_now.prompt_mask
        # TRL's trainer_state: the optimizer steps done, the fraction of the prompts drawn
        drawn = step * len(starts) * world.size
        state = SimpleNamespace(global_step=step, epoch=drawn / data.n_train)
        per_func, completions = self._score(data, tok, index, out, mask, state, run.interrupt)
        # Advantages and signals over every process's completions: under torchrun a step
        # weighs its completions as one process with the whole batch does.
        every = world.gather(per_func)
        weighed = advantages(every, self.rewards.weights, g, cfg.scale_rewards)
        lengths = mask.sum(1).cpu()
        self._gen = self._signals(
            every,
            weighed.rewards,
            weighed.std,
            weighed.zero_std,
            world.gather(lengths),
            world.gather(ended.cpu()),
        )
        mine = slice(world.rank * len(index), (world.rank + 1) * len(index))
        adv, rewards = weighed.advantages[mine], weighed.rewards[mine]
        self._table(step, data, index, completions, per_func, rewards, adv)
        if cfg.mask_truncated_completions:
            mask = mask & ended[:, None]
        ids = torch.cat((prompt_ids, out), dim=1)
        segments = torch.cat((prompt_mask, torch.ones_like(mask)), dim=1).long()
        # dapo's normalizer: the step's completion tokens over every process, as a share
        # per process (their mean: DDP averages the processes' gradients)
        n_items = float(world.mean(mask.sum().float()))
        # What the step trains on, without padding: the prompts' and completions' tokens.
        self._tokens = int(prompt_mask.sum()) + int(lengths.sum())
        adv = adv.to(run.device)
        rows = cfg.batch_size * g
        chunks = []
        for s in range(0, len(index), rows):
            part = slice(s, s + rows)
            roll = _trimmed(
                ids[part], segments[part], prompt_ids.shape[1], mask[part], adv[part], n_items
            )
            roll.images = to_device(data.images_of(index[part]), run.device)
            chunks.append(roll)
        return chunks

    def _sample(
        self, run: RunState, cfg: TrainConfig, index: list[int], gen, step: int, world=None
    ):
        """A completion for each prompt in index, all as one batch (at most a step's rows);
        after an out-of-memory error in halves, which draw the same tokens (see _pick).
        Under torchrun (world) each process draws its own share of the whole step's
        uniforms: the completions do not depend on the number of processes."""
        tok = run.data.tokenizer
        pad = tok.eos_id if tok.eos_id is not None else 0
        prompts = [run.data.ids[i] for i in index]
        n_new, n = cfg.max_completion_tokens, len(prompts)
        rank, size = (world.rank, world.size) if world is not None else (0, 1)
        uniforms = torch.rand((n * size, n_new), generator=gen, device=run.device)
        uniforms = uniforms[rank * n : (rank + 1) * n]
        step_rows = cfg.batch_size * cfg.grad_accum * cfg.num_generations
        while True:
            rows = min(self.sample_rows or step_rows, len(prompts))
            try:
                parts = [
                    sample(
                        run.model,
                        prompts[s : s + rows],
                        n_new,
                        cfg.temperature,
                        cfg.top_p,
                        tok.stop_ids,
                        pad,
                        uniforms[s : s + rows],
                        run.device,
                        run.precision,
                        to_device(run.data.images_of(index[s : s + rows]), run.device),
                    )
                    for s in range(0, len(prompts), rows)
                ]
                return joined(parts, pad)
            except Exception as e:
                if not is_oom(e) or rows == 1:
                    raise
            if run.device.type == "cuda":  # what the failed batch held
                torch.cuda.empty_cache()
            self.sample_rows = rows // 2
            where = f"at step {step + 1}" if step >= 0 else "the held-out prompts"
            self.log(
                f"out of memory sampling {where}: {rows // 2} completions at a time "
                f"(was {rows}), the same draws"
            )

    def _score(self, data, tok, index, out, mask, state: SimpleNamespace, interrupt=None):
        ids = [row[m].tolist() for row, m in zip(out.cpu(), mask.cpu(), strict=True)]
        stops = set(tok.stop_ids)
        # TRL decodes with skip_special_tokens: a reward never sees <|endoftext|> and the like
        texts = [tok.decode([t for t in row if t not in stops], skip_special=True) for row in ids]
        records = [data.records[i] for i in index]
        prompts = [r["prompt"] for r in records]
        if data.conversational:
            completions = [[{"role": "assistant", "content": t}] for t in texts]
        else:
            completions = texts
        columns = {c: [r.get(c) for r in records] for c in data.columns}
        rows = [r["row"] for r in records]
        per_func = self.rewards.score(prompts, completions, ids, columns, rows, state, interrupt)
        return per_func, completions

    def _signals(self, per_func, rewards, std, zero_std, lengths, ended) -> dict:
        """TRL's sampling metrics of the step (read on the CPU, no device sync)."""
        out = {
            "reward": float(torch.nanmean(rewards)),
            "reward_std": float(nanstd(rewards)),
            "frac_reward_zero_std": float(zero_std.float().mean()),
        }
        for j, name in enumerate(self.rewards.names):
            out[f"rewards/{name}/mean"] = float(torch.nanmean(per_func[:, j]))
            out[f"rewards/{name}/std"] = float(nanstd(per_func[:, j]))
        lengths = lengths.float()
        term = lengths[ended] if bool(ended.any()) else torch.zeros(1)
        out.update(
            {
                "completions/mean_length": float(lengths.mean()),
                "completions/min_length": float(lengths.min()),
                "completions/max_length": float(lengths.max()),
                "completions/clipped_ratio": float((~ended).float().mean()),
                "completions/mean_terminated_length": float(term.mean()),
            }
        )
        for name, values in self.rewards.metrics.items():
            out[name] = sum(values) / len(values)
        return {k: (v if math.isfinite(v) else None) for k, v in out.items()}

    def _table(self, step, data, index, completions, per_func, rewards, adv) -> None:
        """The latest sampled completions with their rewards: where reward hacking shows."""
        rows = []
        for i in range(min(len(index), TABLE_ROWS)):
            prompt = data.records[index[i]]["prompt"]
            if isinstance(prompt, list):
                prompt = prompt[-1]["content"]
            if isinstance(prompt, list):  # an image prompt's text parts
                prompt = "".join(p.get("text", "") for p in prompt if isinstance(p, dict))
            row = {
                "prompt": str(prompt)[:TABLE_CHARS],
                "completion": text_of(completions[i])[:TABLE_CHARS],
                "rewards": {n: _finite(per_func[i, j]) for j, n in enumerate(self.rewards.names)},
                "reward": _finite(rewards[i]),
                "advantage": _finite(adv[i]),
            }
            if data.image_names[index[i]]:  # the Completions window shows them
                row["images"] = data.image_names[index[i]]
            for column, values in self.rewards.extra.items():
                row[column] = values[i] if i < len(values) else None
            rows.append(row)
        self.latest = rows
        if self.main and getattr(self.folder, "path", None) is not None:
            path = self.folder.path / "completions.jsonl"
            if not self._table_started:  # a resumed run: steps past its checkpoint go
                self._table_started = True
                drop_records_past(path, step)
            if path.parent.is_dir():
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": step + 1, "rows": rows}) + "\n")

    def micro_loss(self, run: RunState, cfg: TrainConfig, roll: Rollout):
        width = roll.prompt_width
        targets = roll.ids[:, width:]
        ref = None
        if cfg.grpo_beta != 0.0:
            with torch.no_grad():
                reference = self._reference_model(run)
                ref, _, _ = self._logps(
                    reference,
                    reference,
                    run,
                    cfg,
                    roll,
                    targets,
                    no_adapters=self.reference is None,
                )
        logps, entropy, penalty = self._logps(run.train_model, run.model, run, cfg, roll, targets)
        loss, kl, ratio = policy_loss(
            logps, logps.detach(), ref, roll.advantages, roll.completion_mask, cfg, roll.n_items
        )
        loss = loss if penalty is None else loss + penalty  # an MoE's load-balancing loss
        m = roll.completion_mask.float()
        a = roll.advantages[:, None]
        low = ((ratio < 1 - cfg.epsilon) & (a < 0)).float()
        high = ((ratio > 1 + cfg.epsilon) & (a > 0)).float()
        kl_sum = (kl * m).sum() if kl is not None else m.new_zeros(())
        sums = torch.stack(
            [
                kl_sum,
                (entropy * m).sum(),
                (low * m).sum(),
                (high * m).sum(),
                (((low + high) > 0).float() * m).sum(),
                m.sum(),
            ]
        ).detach()
        return loss, sums

    def _reference_model(self, run: RunState):
        return self.reference if self.reference is not None else run.model

    def _logps(self, model, gpt, run, cfg, roll: Rollout, targets, no_adapters: bool = False):
        """The completion tokens' log-probs and entropies (n, C), and the MoE penalty or
        None, from the model's own forward (model: what runs it, compiled or DDP-wrapped as
        it trains; gpt: the model itself, whose head core.models.loss.token_logps takes a
        chunk at a time, so the whole vocabulary's logits of every completion position never
        exist at once). Under the sampling temperature; greedy sampling (0) scores under the
        model's own distribution (1)."""
        width = roll.prompt_width
        # position t predicts token t + 1: the completion's predictions are from P - 1 on
        every = torch.zeros_like(roll.ids)
        every[:, width - 1 : -1] = targets
        mask = torch.zeros_like(roll.ids, dtype=torch.bool)
        mask[:, width - 1 : -1] = roll.completion_mask
        real = roll.segments != 0  # not the prompt's left padding, nor past the stop
        real[:, width:] &= roll.completion_mask
        with autocast(run.device, run.precision), _adapters_off(run.model, no_adapters):
            forward = run.model if no_adapters else model
            seen = {} if roll.images is None else {"images": roll.images}
            hidden, penalty = forward(roll.ids, segments=roll.segments, real=real, **seen)
            head = gpt.output_head()
            logps, entropy = token_logps(head, hidden, every, mask, cfg.temperature or 1.0)
        return logps[:, width - 1 : -1], entropy[:, width - 1 : -1], penalty

    def step_signals(self, sums: torch.Tensor | None) -> StepSignals:
        """The loss's sums, the sampling's metrics, and as the step's tokens (tokens/s) each
        row's prompt and completion tokens, not the G x B rows' padding."""
        return StepSignals(sums, sampled=self._gen, tokens=self._tokens)

    def best_meta(self, best: float | None) -> dict:
        """best.pt is chosen by minus the held-out reward: recorded as the reward it is."""
        return {"val_loss": None, "eval_reward": None if best is None else -best}

    def records(self, signals: list[StepSignals], cfg: TrainConfig, world) -> list[dict]:
        # every process's sums (a torchrun step's tokens, entropy and clipping)
        sums = (world.mean(torch.stack([s.sums for s in signals])) * world.size).cpu()
        out = []
        for row, signal in zip(sums, signals, strict=True):
            tokens = max(float(row[-1]), 1.0)
            rec = dict(signal.sampled)
            rec["entropy"] = float(row[1]) / tokens
            for k, name in enumerate(LOSS_SUMS[2:5], start=2):
                rec[name] = float(row[k]) / tokens
            if cfg.grpo_beta != 0.0:
                rec["kl"] = float(row[0]) / tokens
            out.append(rec)
        return out

    # -- evaluation ---------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, run: RunState, cfg: TrainConfig) -> tuple[float, dict, str]:
        """The mean reward of one completion per held-out prompt, drawn with a fixed
        generator (the same draw each time); lower is better: minus the reward."""
        data, tok = run.data, run.data.tokenizer
        index = data.eval_index(cfg.eval_batches * cfg.batch_size * cfg.grad_accum)
        gen = torch.Generator(device=run.device).manual_seed(cfg.seed)
        drawn = self._sample(run, cfg, index, gen, -1)
        held_out = SimpleNamespace(global_step=-1, epoch=-1.0)  # no step's draw
        scores, _ = self._score(
            data, tok, index, drawn.completions, drawn.completion_mask, held_out, run.interrupt
        )
        rewards = (scores * self.rewards.weights[None, :]).nansum(dim=1)
        reward = float(rewards.mean())
        record = {"eval_reward": reward}
        for j, name in enumerate(self.rewards.names):
            record[f"eval_rewards/{name}/mean"] = _finite(torch.nanmean(scores[:, j]))
        each = ", ".join(
            f"{n} {record[f'eval_rewards/{n}/mean'] or 0:.3f}" for n in self.rewards.names
        )
        return -reward, record, f"eval reward {reward:.4f} ({each}) on {len(index)} prompts"


@contextmanager
def _adapters_off(model, off: bool):
    """The reference under LoRA: the model in eval mode with its adapters off."""
    if not off:
        yield
        return
    was = model.training
    model.eval()
    try:
        with lora.adapters_disabled(model):
            yield
    finally:
        model.train(was)


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _trimmed(ids, segments, width: int, mask, adv, n_items: float) -> Rollout:
    """A micro-batch without the columns no row of it uses (left padding, a tail after every
    completion ended)."""
    pad_left = int((segments[:, :width] == 0).all(0).long().cumprod(0).sum())
    used = mask.any(0)
    c = int(used.nonzero().max()) + 1 if bool(used.any()) else 1
    ids = ids[:, pad_left : width + c]
    segments = segments[:, pad_left : width + c]
    return Rollout(ids, segments, width - pad_left, mask[:, :c], adv, n_items)
