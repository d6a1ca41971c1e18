"""How fast is this project on this machine? Prints a table and writes the figures to JSON.

    python -m bench                              the default sections (about 6 minutes on 2 CPU cores)
    python -m bench --only sampling,attention    some sections
    python -m bench --only recipe                nanoGPT's full recipe in this trainer (slow)
    python -m bench --only compile               train.compile=true against eager (slow)
    python -m bench --only gpu,gpu_sampling      on a CUDA GPU (with --repeats 1, about 4 minutes on an H200)
    make bench                                   the same as python -m bench

Run it from the project's folder, where python -m finds the bench/ package (make bench does).

Sections (each figure is the median of --repeats runs):
    peak       fp32 matmul rate of this machine (1024 x 1024 x 1024), the yardstick for MFU
    training   train.py itself on nanoGPT's CPU recipe shape (char-level tiny shakespeare,
               4 layers, 4 heads, 128 dims, block 64, batch 12, AdamW): tokens/s as the run
               logged it to TensorBoard, model FLOP/s and MFU against the measured peak, peak memory
    quality    time to quality: wall time of `train.py experiment=shakespeare_char_cpu`, start
               to exit, and the val loss it ends with (200 batches); the target is 1.886,
               nanoGPT's README CPU recipe's val loss
    recipe     (not by default) nanoGPT's CPU recipe itself in this trainer: 2,000 steps of
               AdamW at lr 1e-3 with a cosine schedule, learned positions, GELU; wall time and val loss
    compile    (not by default) the training section's runs eager and with train.compile=true:
               tokens/s after the first log window, and wall time with compiling from scratch
    startup    seconds from a process's start: train.py (the default run) to its first step,
               sample.py to its text (50 tokens), and python -c 'import torch' alone
    sampling   1,000 new tokens at block_size 256, with and without the KV cache, and with the
               compiled decode step (compile=true; also its compile time), for nanoGPT's
               shakespeare-char model (6 layers, 6 heads, 384 dims) and this project's default
               model (configs/model/gpt.yaml, vocabulary 1,274)
    kv_cache   the KV cache's bytes and decoding tokens/s (32 greedy tokens, eager, the prompt's
               forward not counted) at 1k, 4k and 16k tokens of context, for the default model
               with 8 heads: a key/value head each (MHA), one per 4 (GQA 4:1), one (MQA), and a
               window of 256 (a ring cache); about 40 s
    attention  forward + backward of the sdpa and manual paths against the same projections
               around a bare scaled_dot_product_attention call
    data       (not by default) tokenising a corpus of --data-mb megabytes (the .py files of this
               Python's installed packages, concatenated) from an empty cache, char and BPE (2,048
               tokens): each phase's time, MB/s and peak memory, beside the nanoGPT way (the whole
               file read into memory and encoded at once; BPE with the same learned vocabulary; up
               to 200 MB); and learning 2,048 BPE tokens from its first 10 MB, by rustbpe and by
               data/bpe.py
    nanogpt    (not by default; needs --nanogpt <a checkout of karpathy/nanoGPT>) nanoGPT itself,
               side by side with this project: its README CPU recipe's ms per iteration over
               --steps iterations (after the first sixth), and the whole recipe (2,000 iterations)
               start to exit with the val loss it prints; with the training and quality sections
               in the same run, the ratios
    tab        (not by default; needs Chromium, see make browser) the Attention tab in headless
               Chromium at 1280 x 800, for a short real run of the default model and of a 12 x 12
               one on a 128-token probe (5 logged steps each): time from navigation to the first
               drawn view (a fresh browser each time), and, once the tab has fetched every step,
               the slowest move of the step slider to its redrawn views
    text       the Attention tab's answer to your own text: ms from the text to the JSON the route
               sends (tokenizing, the forward with attention weights, the top 5 next tokens, the
               losses), for block_size (128) tokens of a held-out story and the default model on
               CPU; intact, and with one head knocked out (two forwards)
    loading    (not by default; writes 1.4 GB) peak memory of a fresh process loading GPT-2 medium's shape of
               random weights from a Hugging Face folder (model_io/hf_models.py), against their file's size
    gpt2_sampling  (not by default; about 2 minutes on a shared 2-core machine) greedy sampling at GPT-2
               small's shape (124M, random weights written by transformers and read by
               model_io/hf_models.py) at fp32 and bf16: tokens/s of 48 new tokens after a 32-token
               prompt, sample.py's path (the KV cache, eager and compiled) against transformers'
               generate(do_sample=False), each beside the limit the memory's read rate sets (x.sum()
               over 1 GiB), and whether they chose the same tokens
    gpt2_finetune  (not by default; needs --nanogpt <a checkout of karpathy/nanoGPT>; about 8 minutes there)
               training steps (forward, backward, clipping, AdamW) at GPT-2 small's shape, 1 x 256
               tokens, fp32: this project's TrainStep against nanoGPT's model.py, in turns
    gpu        (not by default; needs a CUDA GPU) the GPU's bf16 matmul rate (8192^3 products) beside
               NVIDIA's stated dense rate for its name (H100/H200 SXM 989 TFLOP/s, A100 312); then
               training steps (TrainStep, built by training/build.py's build_run as train.py builds it, bf16
               autocast, random token ids) eager and with train.compile=true, for the default model (batch 16
               x 128, Muon), nanoGPT's shakespeare-char size with the default model's options (6 x 6 x 384,
               64 x 256, Muon) and GPT-2 small (12 x 12 x 768, GPT-2's blocks, 16 x 1024, AdamW): tokens/s,
               ms/step and MFU (6 x matmul weights + 12 x layers x T x C FLOPs a token) against both rates,
               peak GPU memory, warm-up (compiling) seconds; where GPT-2 small's compiled MFU misses the
               goal of 45% (every shape's with --gpu-profile), its top 15 kernels by GPU time over 3 steps
    gpu_sampling  (not by default; needs a CUDA GPU) ms per greedy token (200 after a 32-token prompt), at
               fp32 and bf16, with the KV cache and recomputing, and at bf16 (sample.py's dtype=auto there)
               with the compiled decode step (compile=true), for the default model (block 128) and GPT-2
               small's shape (block 1024), random weights
    gpu_finetune  (not by default; needs a CUDA GPU) training steps of GPT-2 small as init_from builds it:
               its Hugging Face folder (written with random weights) read in, GPT-2's 50,257 tokens,
               16 x 1024 tokens a step, experiment=finetune_gpt2's AdamW; at bf16 and at fp16 (the loss
               scaler), eager and compiled, beside the gpu section's GPT-2 small (vocabulary padded to
               50,304) at bf16: tokens/s, MFU against the stated rate, peak memory, seconds to read it
    nanogpt_gpu  (not by default; needs a CUDA GPU and --nanogpt <a checkout of karpathy/nanoGPT>)
               nanoGPT's GPU recipe (its config/train_shakespeare_char.py, unchanged) against
               experiment=shakespeare_char_gpu, one after the other: seconds from each command's
               start to its first val loss at or under 1.47, where it is stopped; --gpu-recipe-steps
               600,1000 runs the preset at those train.max_steps (each evaluating every 100 steps then)

--gpu-device cpu --gpu-quick runs every path of the gpu sections at tiny shapes on a CPU (a minute or two).
A failure in one of their figures (out of memory, a compile) is reported in its place, and each
figure goes to stderr as it is measured.

kv_cache and gpt2_sampling run at one torch thread unless --threads says otherwise: on a machine
other jobs share, a second thread makes a token's time move tenfold (docs/speed.md).

Results go to bench_results/bench-<date>_<time>.json (git-ignored) unless --out says otherwise;
the training section's run dirs go beside it.
"""
