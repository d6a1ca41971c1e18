"""The results as a two-column table on stdout."""

from collections.abc import Callable

from bench.corpora import AT_ONCE_MAX_MB
from bench.training import TARGET_VAL_LOSS

Rows = list[tuple[str, str]]


def print_table(results: dict) -> None:
    """Each section's rows, in the order of SECTION_ROWS, for the sections results holds."""
    rows: Rows = []
    for section, section_rows in SECTION_ROWS.items():
        if section in results:  # nanoGPT's rows set its figures beside ours: they read all the results
            rows += nanogpt_rows(results) if section == "nanogpt" else section_rows(results[section])
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def peak_rows(p: dict) -> Rows:
    return [("fp32 matmul peak (1024^3)", f"{p['matmul_gflops']:.1f} GFLOP/s")]


def training_rows(t: dict) -> Rows:
    mfu = f", MFU {t['mfu']:.0%}" if t["mfu"] else ""
    return [
        ("training, nanoGPT CPU shape", f"{t['tokens_per_sec']:,.0f} tokens/s ({t['ms_per_step']:.1f} ms/step)"),
        ("  model FLOP/s", f"{t['model_gflops']:.1f} GFLOP/s{mfu}"),
        ("  peak memory (train.py)", f"{t['peak_rss_mib']:.0f} MiB"),
    ]


def quality_rows(label: str) -> Callable[[dict], Rows]:
    def rows(q: dict) -> Rows:
        return [(label, f"{q['seconds']:.1f} s wall, val loss {q['val_loss']:.4f} "
                        f"({'reaches' if q['reached_target'] else 'misses'} {TARGET_VAL_LOSS})")]
    return rows


def compile_rows(c: dict) -> Rows:
    eager, compiled = c["eager"], c["compiled"]
    return [
        ("training, train.compile=true", f"{compiled['tokens_per_sec']:,.0f} tokens/s ({c['speedup']:.2f}x "
                                         f"eager's {eager['tokens_per_sec']:,.0f})"),
        (f"  wall time, {compiled['steps']} steps", f"{compiled['seconds']:.1f} s compiled, {eager['seconds']:.1f} s eager"),
    ]


def sampling_rows(shapes: dict) -> Rows:
    rows = []
    for shape, s in shapes.items():
        rows += [
            (f"sampling, {shape} model, block 256", f"{s['kv_cache_tokens_per_sec']:,.0f} tokens/s with KV cache "
                                                   f"({s['kv_cache_ms_per_token']:.2f} ms/token), "
                                                   f"{s['recompute_tokens_per_sec']:,.0f} recomputing ({s['speedup']:.1f}x)"),
            ("  compiled decode step (compile=true)", f"{s['compiled_tokens_per_sec']:,.0f} tokens/s "
                                                     f"({s['compiled_ms_per_token']:.2f} ms/token, {s['compiled_speedup']:.1f}x "
                                                     f"recomputing), after {s['compile_seconds']:.1f} s compiling"),
        ]
    return rows


def attention_rows(shapes: dict) -> Rows:
    return [(f"attention fwd+bwd {shape}", f"bare {a['bare_sdpa_ms']:.2f} ms, sdpa {a['sdpa_ms']:.2f} ms "
                                          f"({a['sdpa_vs_bare']:.2f}x), manual {a['manual_ms']:.2f} ms ({a['manual_vs_bare']:.2f}x)")
            for shape, a in shapes.items()]


def startup_rows(u: dict) -> Rows:
    return [("start-up, seconds from the process's start", f"train.py to its first step {u['train_first_step_seconds']:.1f}, "
             f"sample.py to its text {u['sample_seconds']:.1f}, python -c 'import torch' {u['import_torch_seconds']:.1f}")]


def tab_rows(shapes: dict) -> Rows:
    return [(f"Attention tab, {shape}", f"first render {t['first_render_s']:.2f} s, "
                                        f"step change {t['step_change_s'] * 1e3:.0f} ms at most") for shape, t in shapes.items()]


def threads_text(threads: int) -> str:
    return f"{threads} torch thread{'s' if threads > 1 else ''}"


def text_rows(t: dict) -> Rows:
    return [
        (f"Attention tab, your text ({t['tokens']} tokens)", f"{t['answer_ms']:.0f} ms per answer, "
         f"{t['knocked_out_answer_ms']:.0f} ms with a head knocked out (default model, CPU, {threads_text(t['threads'])})"),
        (f"  repeated random tokens ({t['repeated_tokens']} tokens)", f"{t['repeated_answer_ms']:.0f} ms per answer, "
         f"{t['repeated_knocked_out_answer_ms']:.0f} ms with a head knocked out"),
        (f"  tools: lens, attribution ({t['tokens']} tokens)", f"{t['lens_ms']:.0f} ms, {t['attribution_ms']:.0f} ms "
         "(each head's knock-out included)"),
        (f"  tools: patching ({t['patch_tokens']} tokens twice)", f"{t['patch_ms']:.0f} ms (every head, every layer "
         "and position)"),
    ]


def gpt2_text_rows(t: dict) -> Rows:
    return [(f"Attention tab, your text at GPT-2 small's shape ({t['tokens']} tokens)",
             f"{t['answer_ms']:.0f} ms per answer, {t['knocked_out_answer_ms']:.0f} ms with a head knocked out "
             f"({t['model_mb']:.0f} MiB of weights, CPU, {threads_text(t['threads'])})")]


def loading_rows(m: dict) -> Rows:
    return [("loading GPT-2 medium's shape (Hugging Face folder)",
             f"peak memory {m['peak_gb']:.2f} GB for {m['weights_gb']:.2f} GB of weights ({m['peak_vs_weights']:.2f}x; "
             f"{m['imports_gb']:.2f} GB of it the imports)")]


def gpt2_finetune_rows(f: dict) -> Rows:
    return [(f"fine-tuning steps, GPT-2 small's shape, {f['batch_size']} x {f['sequence_length']} tokens",
             f"{f['tokens_per_sec']:.1f} tokens/s, nanoGPT's model.py {f['nanogpt_tokens_per_sec']:.1f} "
             f"({f['vs_nanogpt']:.2f}x its speed)")]


def kv_cache_rows(k: dict) -> Rows:
    """One row per variant: its cache's size and its decoding rate at each context."""
    contexts = " / ".join(f"{context // 1024}k" if context % 1024 == 0 else str(context) for context in k["contexts"])
    threads = f"{k['threads']} thread{'s' if k['threads'] > 1 else ''}"
    rows = [(f"KV cache and decoding at {contexts} tokens of context",
             f"the default model ({k['n_embd']} wide, {k['n_layer']} layers) with n_head {k['n_head']}, not 4, so that GQA 4:1 "
             f"has 2 key/value heads and MQA 1; fp32; {k['new_tokens']} greedy tokens, eager, {threads}, after a prompt "
             "that fills the context (its prefill not in the rate); full attention with block_size = the context")]
    for name, v in k["variants"].items():
        heads = f"{v['kv_heads']} key/value head{'s' if v['kv_heads'] > 1 else ''}"
        shape = f"{heads}, a ring of {v['window']} slots, block_size {v['block_size'][0]}" if v["window"] else heads
        sizes = " / ".join(f"{size / 2**20:g}" for size in v["cache_bytes"])
        rates = " / ".join(f"{rate:,.0f}" for rate in v["decode_tokens_per_sec"])
        check = ("" if v["cache_bytes"] == v["expected_cache_bytes"] else
                 f" (NOT 2 x n_layer x K x S x D x 4 bytes: {' / '.join(str(b) for b in v['expected_cache_bytes'])})")
        rows.append((f"  {name} ({shape})", f"cache {sizes} MiB{check}; {rates} tokens/s"))
    return rows


GPT2_PATHS = {"compiled": "compiled decode step (compile=true)", "eager": "KV cache, eager", "transformers": "transformers' generate"}


def gpt2_sampling_rows(g: dict) -> Rows:
    """Each precision's limit, then each path's tokens/s, its share of that limit and its ratio to transformers."""
    threads = f"{g['threads']} thread{'s' if g['threads'] > 1 else ''}"
    limits = ", ".join(f"{p['limit_tokens_per_sec']:.1f} tokens/s at {name} ({p['weight_bytes'] / 1e6:.0f} MB a token)"
                       for name, p in g["precisions"].items())
    rows = [(f"greedy sampling, GPT-2 small's shape, {g['new_tokens']} tokens after {g['prompt_tokens']}",
             f"memory reads {g['read_gb_per_s']:.1f} GB/s (x.sum() over {g['read_bytes'] >> 20:,} MiB{' on huge pages' if g.get('huge_pages') else ''}, {threads}), so the limit is {limits}; "
             f"native bf16: {'yes' if g['native_bf16'] else 'no'}")]
    for name, p in g["precisions"].items():
        for path, label in GPT2_PATHS.items():
            versus = f", {p[f'{path}_vs_transformers']:.2f}x transformers" if path != "transformers" else ""
            built = f", after {p['compile_seconds']:.1f} s compiling" if path == "compiled" else ""
            rows.append((f"  {name}, {label}", f"{p[f'{path}_tokens_per_sec']:.1f} tokens/s (decoding alone "
                                              f"{p[f'{path}_decode_tokens_per_sec']:.1f}, {p[f'{path}_share_of_limit']:.0%} "
                                              f"of the limit){versus}{built}"))
        same = "yes" if p["same_greedy_tokens"] else (f"NO (compiled first differs at {p['compiled_first_difference']}, "
                                                      f"eager at {p['eager_first_difference']})")
        rows.append((f"  {name}, the same greedy tokens as transformers", same))
    return rows


def data_rows(d: dict) -> Rows:
    rows = []
    for kind in ("char", "bpe"):
        st, mem = d[kind]["streamed"], d[kind].get("in_memory")
        learn = f", of which learning the vocabulary {st['tokenizer_s']:.1f} s" if kind == "bpe" else ""
        rows.append((f"tokenising {d['corpus_mb']:.0f} MB, {kind}, streamed",
                     f"{st['seconds']:.1f} s ({st['mb_per_s']:.1f} MB/s){learn}; peak memory {st['peak_mib']:.0f} MiB"))
        rows.append(("  the same at once (nanoGPT's way)",
                     f"{mem['seconds']:.1f} s ({mem['mb_per_s']:.1f} MB/s); peak memory {mem['peak_mib']:.0f} MiB"
                     if mem else f"not run above {AT_ONCE_MAX_MB} MB (it holds the whole corpus in memory)"))
    t = d["trainers"]
    rows.append((f"learning 2,048 BPE tokens from {t['mb']:.0f} MB",
                 f"rustbpe {t['rustbpe_s']:.1f} s, data/bpe.py {t['lesson_s']:.1f} s ({t['lesson_s'] / t['rustbpe_s']:.0f}x)"))
    return rows


def nanogpt_rows(results: dict) -> Rows:
    """nanoGPT's figures, and the ratios to this project's when its sections ran too."""
    n = results["nanogpt"]
    ours, quality = results.get("training", {}).get("ms_per_step"), results.get("quality", {}).get("seconds")
    return [
        ("nanoGPT itself, same shape", f"{n['tokens_per_sec']:,.0f} tokens/s ({n['ms_per_iter']:.1f} ms/iteration)"
         + (f"; this trainer {n['ms_per_iter'] / ours:.2f}x its speed" if ours else "")),
        ("nanoGPT itself, its CPU recipe", f"{n['recipe_seconds']:.1f} s to val {n['recipe_val_loss']:.4f}"
         + (f"; the preset takes {quality / n['recipe_seconds']:.2f}x its time" if quality else "")),
    ]


def share(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "n/a"


def gpu_rows(g: dict) -> Rows:
    """The matmul peak, then per shape a heading and a row per mode: tokens/s, MFU against both
    peaks, memory, warm-up; a profile's top kernels under the mode it profiled."""
    measured = g["measured_bf16_tflops"]
    stated = f"; stated dense {g['stated_bf16_tflops']} TFLOP/s" if g["stated_bf16_tflops"] else "; no stated peak for it"
    rows = [(f"GPU bf16 matmul ({g['matmul_n']}^3), {g['device']}",
             (f"{measured:,.1f} TFLOP/s measured" if measured else "not measured") + stated
             + (f" ({measured / g['stated_bf16_tflops']:.0%} of it)" if measured and g["stated_bf16_tflops"] else ""))]
    for name, s in g["shapes"].items():
        rows.append((f"training on the GPU, {name}", f"{s['n_layer']} layers x {s['n_head']} heads x {s['n_embd']}, "
                     f"{s['batch_size']} x {s['block_size']} tokens a step, vocabulary {s['vocab_size']:,}, {s['optimizer']}, bf16 autocast"))
        for mode in ("eager", "compiled"):
            if mode not in s:
                continue
            m = s[mode]
            if "error" in m:
                rows.append((f"  {mode}", f"failed: {m['error']}"))
                continue
            rows.append((f"  {mode} ({m['params'] / 1e6:.1f}M parameters)", training_figures(m, of_measured=True)))
            if "profile" in m:
                rows += profile_rows(m["profile"])
    return rows


def training_figures(m: dict, of_measured: bool) -> str:
    """One timing of time_training (bench/gpu.py): tokens/s, MFU (against the measured peak too, where
    the section measured one), peak memory, the seconds to read the model, warm-up, fp16's loss scale."""
    measured = f", {share(m['mfu_measured'])} of measured" if of_measured else ""
    memory = f", peak {m['peak_memory_gib']:.1f} GiB" if m["peak_memory_gib"] is not None else ""
    loaded = f"; read in {m['load_seconds']:.1f} s" if m.get("load_seconds") is not None else ""
    scale = f"; loss scale {m['loss_scale']:,.0f} after" if m.get("loss_scale") is not None else ""
    return (f"{m['tokens_per_sec']:,.0f} tokens/s ({m['ms_per_step']:.1f} ms/step), MFU {share(m['mfu_stated'])} of "
            f"stated{measured}{memory}{loaded}; {m['warmup_seconds']:.1f} s for {m['warmup_steps']} warm-up steps{scale}")


def profile_rows(p: dict) -> Rows:
    if "error" in p:
        return [("    profile", f"failed: {p['error']}")]
    busy = (f"the GPU busy {p['busy_ms']:.1f} ms of {p['wall_ms']:.1f} ms wall ({p['busy_ms'] / p['wall_ms']:.0%})"
            if p["by"] == "GPU time" else f"{p['busy_ms']:.1f} ms of CPU time in {p['wall_ms']:.1f} ms wall")
    rows = [(f"    profile of {p['steps']} steps", f"{busy}; the top {len(p['top'])} by {p['by']}:")]
    for op in p["top"]:
        name = op["name"] if len(op["name"]) <= 60 else op["name"][:57] + "..."
        rows.append((f"      {name}", f"{op['ms']:.2f} ms ({share(op['share'])}), {op['calls']} calls"))
    return rows


def gpu_sampling_rows(g: dict) -> Rows:
    """Per shape and dtype: ms per token with the KV cache, recomputing, and compiled."""
    rows = []
    for name, s in g["shapes"].items():
        rows.append((f"greedy sampling on the GPU, {name}", f"{s['params'] / 1e6:.1f}M parameters, block {s['block_size']}, "
                     f"{g['new_tokens']} new tokens after {g['prompt_tokens']}, ms per new token ({g['device']})"))
        for dtype, p in s["precisions"].items():
            parts = []
            for path, label in (("kv_cache", "KV cache"), ("recompute", "recomputing"), ("compiled", "compiled decode step")):
                figures = p.get(path, {})
                if "error" in figures:
                    parts.append(f"{label} failed ({figures['error']})")
                elif figures:
                    built = f" after {figures['compile_seconds']:.1f} s compiling" if "compile_seconds" in figures else ""
                    differs = figures.get("first_difference_from_kv_cache")
                    other = f", other tokens from {differs}" if differs is not None else ""
                    parts.append(f"{label} {figures['ms_per_token']:.2f}{built}{other}")
            rows.append((f"  {dtype} weights", "; ".join(parts)))
    return rows


def gpu_finetune_rows(g: dict) -> Rows:
    """A heading, then per run (model, dtype) a row per mode: tokens/s, MFU, memory, load and warm-up."""
    rows = [("fine-tuning on the GPU, GPT-2 small as init_from builds it", f"{g['n_layer']} layers x {g['n_head']} heads x "
             f"{g['n_embd']}, {g['batch_size']} x {g['block_size']} tokens a step, AdamW ({g['device']})")]
    for name, run in g["runs"].items():
        model_from, dtype = name.split(", ")
        model = "read from its Hugging Face folder, vocabulary" if model_from == "from_folder" else \
            "random weights, vocabulary padded to"
        rows.append((f"  {model} {run['vocab_size']:,}, {dtype}", ""))
        for mode in ("eager", "compiled"):
            m = run.get(mode)
            if m is None:
                continue
            if "error" in m:
                rows.append((f"    {mode}", f"failed: {m['error']}"))
                continue
            rows.append((f"    {mode}", training_figures(m, of_measured=False)))
    return rows


def nanogpt_gpu_rows(r: dict) -> Rows:
    """Each side's wall time from its start to val loss r['target'], or its best val loss."""
    def reached(run: dict) -> str:
        if run["seconds_to_target"] is None:
            return f"misses it: best val loss {run['best_val_loss']} in {run['seconds']:.1f} s"
        return f"{run['seconds_to_target']:.1f} s (val {run['curve'][-1][2]:.4f} at step {run['curve'][-1][1]})"
    rows = [(f"to val loss {r['target']} on the GPU: nanoGPT", reached(r["nanogpt"]))]
    rows += [(f"  shakespeare_char_gpu, {steps} steps", reached(run)) for steps, run in r["ours"].items()]
    if r["ratio"]:
        rows.append(("  ratio (ours fastest / nanoGPT)", f"{r['ratio']:.2f}x"))
    return rows


# The sections' rows, in the table's order.
SECTION_ROWS: dict[str, Callable[[dict], Rows]] = {
    "peak": peak_rows, "training": training_rows, "quality": quality_rows("time to quality (preset)"),
    "recipe": quality_rows("nanoGPT's recipe, this trainer"), "compile": compile_rows, "sampling": sampling_rows,
    "attention": attention_rows, "startup": startup_rows, "data": data_rows, "nanogpt": nanogpt_rows, "tab": tab_rows,
    "text": text_rows, "gpt2_text": gpt2_text_rows, "loading": loading_rows, "kv_cache": kv_cache_rows,
    "gpt2_sampling": gpt2_sampling_rows, "gpt2_finetune": gpt2_finetune_rows, "gpu": gpu_rows,
    "gpu_sampling": gpu_sampling_rows, "gpu_finetune": gpu_finetune_rows, "nanogpt_gpu": nanogpt_gpu_rows,
}
