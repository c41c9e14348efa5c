# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Speculative decoding: exact, or not
#
# A small draft model guesses the next `n_draft` tokens, one pass each; the target checks all of them
# in **one** pass and keeps the guesses that equal its own argmax, plus its own token after the last
# survivor. Every emitted token is the target's argmax, so greedy speculative decoding promises plain
# greedy decoding's output exactly — *if* the target's logits in a pass of `n_draft + 1` tokens are the
# bits it would have computed one token at a time. Notebook 03 showed they are not under
# `BATCH_VARIANT`. Here is what that does to the output, draft by draft, and how the time of a cycle
# is spent.

# %%
import matplotlib.pyplot as plt
import numpy as np
from nbsupport import (
    RESULTS,
    Stopwatch,
    committed_results,
    device_name,
    draft_path,
    load_model,
    model_path,
    show_function,
    warm_up,
)

from hiraishin import ReductionOrder
from hiraishin.decode.speculative import _draft_guesses, speculative_decode

VARIANT, INVARIANT = ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT
ORDERS = (INVARIANT, VARIANT)
PROMPT = "Speculative decoding promises"
N_NEW = 40
N_DRAFT = 8
N_CTX = 256

clock = Stopwatch()
path = model_path()
with clock("load (and write the noisy draft once)"):
    target = load_model(path, n_ctx=N_CTX)
    drafts = {"self": load_model(path, n_ctx=N_CTX), "noisy": load_model(draft_path(path), n_ctx=N_CTX)}
print(target, "on", device_name(target.backend))
print("drafts: 'self' = a second instance of the target (own KV cache); "
      "'noisy' = the target's weights plus seeded noise, requantized")

# %% [markdown]
# ## The loop
#
# The verify step of `speculative_decode`: one target pass over the last accepted token and the
# guesses (`greedy_tokens`: each position's argmax, taken on the GPU where the model can, so no logits
# travel to the host), the longest prefix of guesses that equals the target's argmaxes, then a rollback
# of the rejected KV cells:

# %%
show_function(speculative_decode, marker="best = greedy_tokens(target,", before=1, after=6)

# %% [markdown]
# The drafting before it needs no guess on the host until the last one (unless a confidence cut must
# look at each guess's logits), so the draft's passes run as one chain: `greedy_chain` enqueues every
# pass, each taking its token id from the previous pass's argmax on the device, and with CUDA graphs the
# host waits once per cycle instead of once per guess. The same passes, so the same guesses; on the H200
# it cut a cycle's drafting by 7-10% (`bench/results/2026-12-02-h200-session6/README.md`):

# %%
show_function(_draft_guesses, marker="if gap_min <= 0 and p_min <= 0:", before=0, after=2)

# %% [markdown]
# The verify pass is a pass of up to 9 tokens: under `BATCH_VARIANT` its mat-vecs run 2 warps (5 to 8
# tokens) or llama.cpp's MMQ order (9), and its attention the multi-query kernel — all different orders of
# adds than the one-token passes of plain decoding.
#
# Compilation first (Numba on the CPU, NVRTC on a GPU), so the recorded times below are work:

# %%
with clock("JIT compilation (throwaway passes)"):
    for m in (target, *drafts.values()):
        warm_up(m, ORDERS, widths=(1, 5, 9))

# %% [markdown]
# ## Plain decoding, then draft → verify → accept under each order

# %%
ids = target.tokenizer.encode(PROMPT)
plain, runs = {}, {}
for order in ORDERS:
    with clock(f"plain {order.name}"):
        plain[order.name] = target.generate(ids, max_new_tokens=N_NEW, order=order, stop_at_eos=False)
    for name, draft in drafts.items():
        with clock(f"speculative {order.name}, {name} draft"):
            runs[order.name, name] = target.generate_speculative(
                ids, draft, n_draft=N_DRAFT, order=order, max_new_tokens=N_NEW, stop_at_eos=False,
                plain_tokens=plain[order.name].tokens)

print(f"\n{'order':<16} {'draft':<6} {'drafted':>7} {'accepted':>8} {'rate':>6} {'= plain?':>9} "
      f"{'first ≠ (token index / position)':>33}")
for (order_name, name), r in runs.items():
    where = "-" if r.first_divergence is None else f"{r.first_divergence} / {r.first_divergence_position}"
    print(f"{order_name:<16} {name:<6} {r.drafted:>7} {r.accepted:>8} {r.acceptance_rate:>6.1%} "
          f"{r.matches_plain!s:>9} {where:>33}")

# %% [markdown]
# Read the self-draft rows first. Its guesses are the target's own one-token argmaxes, so the target
# must accept every one of them — unless its verify pass computes other logits than a one-token pass.
# Under `BATCH_INVARIANT` it accepts them all, and both drafts reproduce plain decoding exactly: the
# noisy draft's rejections cost time, never correctness. Under `BATCH_VARIANT` every rejected self-draft
# guess is the bug, and the first flipped argmax sends the output onto another continuation.
#
# ## The first diverging token, and the texts side by side

# %%
diverged = [(key, r) for key, r in runs.items() if r.first_divergence is not None]
for (order_name, name), r in diverged or list(runs.items())[:1]:
    ref = plain[order_name].tokens
    i = r.first_divergence if r.first_divergence is not None else len(ref)
    tok = target.tokenizer
    print(f"{order_name}, {name} draft:", "no divergence in this run" if r.first_divergence is None else
          f"generated token {i} (chosen at position {r.first_divergence_position}) is "
          f"{r.tokens[i]} {tok.decode([r.tokens[i]])!r}; plain decoding has {ref[i]} {tok.decode([ref[i]])!r}")
    common = tok.decode(ref[:i])
    print(f"  common:      {common[-80:]!r}")
    print(f"  plain:       {tok.decode(ref[i:])[:100]!r}")
    print(f"  speculative: {tok.decode(r.tokens[i:])[:100]!r}\n")
if not diverged:
    print("No run left plain decoding here: no verify pass shifted a logit past a top-2 gap for this prompt "
          "and length. The acceptance of the self draft under BATCH_VARIANT still shows the disagreement.")

# %% [markdown]
# ## Measure: one average cycle, to scale
#
# Each cycle records how long the draft took, how long the verify pass took, and the bookkeeping
# (comparisons, rollbacks). Drawn to scale against what plain decoding would have spent on the same
# number of tokens (its recorded seconds per token times the cycle's tokens):

# %%
fig, ax = plt.subplots(figsize=(10, 3.6), layout="constrained")
labels, yticks = [], []
for row, ((order_name, name), r) in enumerate(runs.items()):
    split = r.time_split
    left = 0.0
    for part, color in (("draft", "tab:orange"), ("verify", "tab:blue"), ("bookkeeping", "tab:gray")):
        width = 1e3 * split[part]
        ax.barh(row, width, left=left, color=color, label=part if row == 0 else None)
        left += width
    per_token = float(np.mean(plain[order_name].step_s))
    ax.plot([1e3 * per_token * r.tokens_per_cycle] * 2, [row - 0.4, row + 0.4], color="k", lw=2,
            label="plain decoding, same tokens" if row == 0 else None)
    labels.append(f"{order_name}, {name} draft\n{r.tokens_per_cycle:.1f} tokens/cycle")
    yticks.append(row)
ax.set_yticks(yticks, labels, fontsize=8)
ax.invert_yaxis()
ax.set_xlabel("milliseconds per cycle (mean)")
ax.set_title(f"one average cycle on {target.backend.name}, n_draft = {N_DRAFT}")
ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
plt.show()
for (order_name, name), r in runs.items():
    s = r.time_split
    print(f"{order_name:<16} {name:<6} draft {1e3 * s['draft']:7.1f} ms, verify {1e3 * s['verify']:6.1f} ms, "
          f"bookkeeping {1e3 * s['bookkeeping']:5.2f} ms per cycle; {r.tokens_per_cycle:.2f} tokens per cycle")

# %% [markdown]
# **Interpretation.** A cycle pays for `n_draft` draft passes and one verify pass, and earns the
# accepted tokens plus one. Here the draft is as large as the target (or is the target), so
# drafting costs as much as plain decoding and speculation cannot win; the point of this notebook is
# the *correctness* column. With a real draft several times smaller than the target, on a GPU, the
# draft bars shrink and the verify pass — one pass of 9 tokens, about the cost of one token when the
# weights' bandwidth dominates — carries the cycle. What the invariant order costs in that verify pass
# is notebook 06.

# %% [markdown]
# ## The draft's own order
#
# Exactness is the target's business alone: a guess survives only where it equals the target's own argmax, so
# the draft may compute its guesses in any order of adds, even a batch-variant one, and the tokens stay plain
# decoding's under the target's order. `draft_order=` (`hiraishin speculative --draft-order`) runs the draft's
# passes under an order of their own; here the noisy draft under `BATCH_VARIANT` for a `BATCH_INVARIANT` target:

# %%
with clock("speculative BATCH_INVARIANT, noisy draft under BATCH_VARIANT"):
    mixed = target.generate_speculative(ids, drafts["noisy"], n_draft=N_DRAFT, order=INVARIANT,
                                        max_new_tokens=N_NEW, stop_at_eos=False,
                                        plain_tokens=plain[INVARIANT.name].tokens, draft_order=VARIANT)
print(mixed)

# %% [markdown]
# So the draft's order is a speed choice, and which order is fastest depends on the passes a cycle makes, not only
# on a one-token step. After a cycle that accepted every guess the draft has not yet fed its own last guess, so its
# next cycle starts with a pass of **two** tokens (with the original report's acceptance, 62% of cycles do). On the
# H200 the 0.6B-shaped draft's one-token step costs the same under `BATCH_VARIANT` and `BATCH_INVARIANT`, but its
# pass of three tokens 1.07 ms against 0.82 (`bench/results/2026-12-04-h200-session19/`): the variant order's
# multi-column mat-vec geometry. `hiraishin bench` therefore times each candidate order's first pass at one and two
# tokens and drafts under the order whose passes of the schedule cost least (`draft.speculation_order`).

# %% [markdown]
# ## The draft running ahead
#
# A cycle above drafts, then verifies: on one GPU the small draft's passes and the target's verify pass take
# turns. `draft_ahead=True` (`hiraishin.decode.ahead`) lets the draft go on while the target verifies, as if
# every guess will be accepted: it feeds its last guess and guesses on. When the target then accepts every
# guess *and* emits the draft's next guess, the next cycle's guesses exist already and it verifies at once;
# otherwise they are dropped. The target still decides every token, so the tokens cannot change; what changes
# is when the draft's passes run, and that some are wasted. On the CPU nothing runs side by side, so here it
# only costs; on a GPU the draft's passes run on their own stream beside the verify (`hiraishin bench
# --draft-ahead` measures what that hides):

# %%
with clock("speculative BATCH_INVARIANT, self draft, running ahead"):
    ahead = target.generate_speculative(ids, drafts["self"], n_draft=N_DRAFT, order=INVARIANT, max_new_tokens=N_NEW,
                                        stop_at_eos=False, plain_tokens=plain[INVARIANT.name].tokens, draft_ahead=True)
print(ahead)

# %% [markdown]
# What a GPU showed: the newest committed `hiraishin bench --draft-ahead` run under `bench/results/` (a Qwen3-8B-shaped
# target and a 0.6B-shaped draft; which guesses are right comes from the seeded oracle schedule, every pass runs for
# real). Running ahead takes most of the draft's time off a cycle, since its passes run beside the verify; but the
# verify passes slow down by about as much, because the two models share one GPU and the chain made ahead is
# wasted whenever a guess or the target's next token differs. One pass beside a verify hides well, several do not
# (`bench/overlap_passes.py`), hence `ahead_passes`, the cap on the chain made ahead.

# %%
ahead_runs = [(date, f, data) for date, f, data in committed_results("hiraishin-bench.json")
              if any("ahead" in s for s in data.get("speculative", {}).values())]
if ahead_runs:
    date, f, data = max(ahead_runs, key=lambda run: run[0])
    print(f"{f.relative_to(RESULTS)}: {data['device']['name']}, {date[:10]}, commit {data['commit']}")
    print(f"{'order':<16} {'loop':<14} {'speedup':>8} {'draft ms':>9} {'verify ms':>10} {'made ahead':>11}")
    for order_name, spec in data["speculative"].items():
        if "ahead" not in spec:
            continue
        for loop, run in (("draft, verify", spec), ("draft ahead", spec["ahead"])):
            share = f"{run['ahead_cycles']:.0%}" if "ahead_cycles" in run else "-"
            print(f"{order_name:<16} {loop:<14} {run['speedup']:>7.2f}x {run['cycle_ms']['drafting']:>9.2f} "
                  f"{run['cycle_ms']['verifying']:>10.2f} {share:>11}")
else:
    print("No committed hiraishin-bench.json with a draft-ahead run in this checkout.")

# %%
# The claims of this notebook, checked.
assert ahead.tokens == plain[INVARIANT.name].tokens and ahead.accepted == ahead.drafted
assert mixed.tokens == plain[INVARIANT.name].tokens and mixed.draft_order == VARIANT.name and mixed.drafted > 0
assert all(c.ahead for c in ahead.cycles[1:-1])  # after the first, every cycle's guesses were made ahead
if ahead_runs:  # on the GPU too, running ahead kept plain decoding's tokens under the exact orders
    assert all(spec["ahead"]["matches_plain"] for name, spec in data["speculative"].items()
               if "ahead" in spec and name != "batch_variant")
for name in drafts:
    r = runs[INVARIANT.name, name]
    assert r.drafted > 0, "a run that drafted nothing checks nothing"
    assert r.tokens == plain[INVARIANT.name].tokens, f"BATCH_INVARIANT, {name} draft: not exact"
assert runs[INVARIANT.name, "self"].accepted == runs[INVARIANT.name, "self"].drafted
for r in runs.values():  # every cycle's times were recorded
    assert all(c.verify_s > 0 for c in r.cycles)
print("all claims hold;", clock.summary())
