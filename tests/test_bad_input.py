"""The table of bad inputs: each one to train.py or sample.py is one line on stderr that says what
is wrong and what to do, with exit status 2, no traceback, and nothing written."""

import gzip
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli.errors import check_keys_under_values
from tests.helpers import ROOT, assert_one_error_line, run_cli, tiny_run, tiny_spec
from user_error import UserError

LLAMA3 = "{factor:8,low_freq_factor:1,high_freq_factor:4,original_max_position_embeddings:8192}"  # Llama 3.1's rope scaling


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model.n_layr=3"], "error: model.n_layr is not an option; check its spelling (`python train.py --help`"),
        (["n_layer=3"], "error: n_layer is not an option"),
        (["+model.n_layr=3"], "error: +model.n_layr=3: a + adds a key or a group the config lacks, and this command takes "
                              "only the options it has; give model.n_layr=3 without it (`python train.py --help`"),
        (["++train.max_steps=40"], "error: ++train.max_steps=40: a + adds a key or a group the config lacks, and this command "
                                   "takes only the options it has; give train.max_steps=40 without it"),  # an option: no + needed
        (["+experiment=induction"], "give experiment=induction without it"),  # Hydra's own words: "Multiple values for experiment"
        (["~data"], "error: ~data: ~ removes the data group, which a run needs; give data=<option> instead, one of: "
                    "shakespeare, stories, text\n"),  # Hydra's own: "data: Missing mandatory value: data"
        (["~optim"], "error: ~optim: ~ removes the optim group, which a run needs; give optim=<option> instead, one of: "
                     "default\n"),  # found missing at optim.lr
        (["~tokenizer=bpe"], "error: ~tokenizer: ~ removes the tokenizer group, which a run needs; give tokenizer=<option> "
                             "instead, one of: bpe, char, gpt2\n"),  # removed if it is bpe, as it is
        (["model=huge"], "error: model=huge is not an option of model; choose one of: gpt"),
        (["optimizer=sgd"], "error: optimizer is not an option; check its spelling"),
        (["model.n_layer=[1,"], "error: could not read the argument 'model.n_layer=[1,' (no viable alternative at input '[1,')"),
        (["data=text", "data.path=~/book.txt"], "error: could not read the argument 'data.path=~/book.txt': Hydra's syntax "
                                                 "claims ~; quote the value inside the shell's quotes, e.g. "
                                                 "'data.path=\"~/book.txt\"' (a path given so still starts at your home folder)"),
        (["model.n_head=2,4"], "error: model.n_head=2,4: a comma here means a sweep; add -m for one run per value\n"),
        (["optim.betas=0.9,0.95"], "error: optim.betas=0.9,0.95: a comma here means a sweep; add -m for one run per value, "
                                   "or write a list in brackets ('optim.betas=[a,b]')"),
        (["data=text", "data.path=a.txt,b.txt"], "one run per value, or quote the value to keep it whole ('data.path=\"a, b\"')"),
        (["--hlep"], "error: --hlep is not a flag of this command; `python train.py --help` lists every option"),
        (["-m", "model.n_head=2,4", "--cfg=job"], "error: --cfg and --multirun together: give one of --multirun, --cfg, "
                                                    "--info, --run, --shell-completion at a time"),
        (["--cfg", "nope"], "error: argument --cfg/-c: invalid choice: 'nope' (choose from 'job', 'hydra', 'all')\n"),
        (["-cn"], "error: argument --config-name/-cn: expected one argument\n"),  # argparse's words, without its usage text
        (["--resolve"], "error: --resolve only works with --cfg or --help, e.g. `python train.py --cfg job --resolve`"),
        (["-p", "model"], "error: --package only works with --cfg, e.g. `python train.py --cfg job --package <group>`"),
        (["-sc"], "error: --shell-completion needs what to do: install=bash, uninstall=bash, query=bash (or zsh, fish)"),
        (["--experimental-rerun=job.pickle"], "error: --experimental-rerun=job.pickle is not a flag of this command"),
        (["model.n_layer=${oops}"], "error: model.n_layer: Interpolation key 'oops' not found"),
        (["~model.n_layer"], "error: ~model.n_layer: ~ removes a key, and every option here keeps a value; set it instead "
                             "(model.n_layer=<value>)"),
        (["~data.path"], "error: ~data.path: ~ removes a key, and none can be removed here: data.path is an option that holds "
                         "null (leave it out) or no option at all (check its spelling; `python train.py --help` lists every option)"),
        (["~model.n_layr"], "error: ~model.n_layr: ~ removes a key, and none can be removed here: model.n_layr is an option "
                            "that holds null (leave it out) or no option at all (check its spelling; `python train.py --help` "
                            "lists every option)"),  # misspelt
        (["~nothing"], "error: ~nothing: ~ removes a key, and none can be removed here: nothing is an option that holds null "
                       "(leave it out) or no option at all (check its spelling; `python train.py --help` lists every option)"),
        (["optim.betas.x=1"], "error: optim.betas.x=1: optim.betas is a list, with no options under it; give the whole "
                              "list (optim.betas=[a,b]) or one item by its index (optim.betas.0=a)\n"),  # OmegaConf's traceback
        (["train.sample_temperature=1e-45"], "error: train.sample_temperature=1e-45 is too small to divide float32 logits "
                                             "by; give 0 for greedy decoding, or at least 1e-30"),
        (["run.x=1"], "error: run is not an option; check its spelling"),  # sample.py's key: no schema of train.py's has it
        (["optim.betas.5=0.9"], "error: optim.betas.5: optim.betas holds 2 items; give an index from 0 to 1 (optim.betas.0=a), "
                                "or the whole list (optim.betas=[a,b])\n"),  # OmegaConf's words: "list index out of range"
        (["train.keep_checkpoints.x=1"], "error: train.keep_checkpoints.x=1: train.keep_checkpoints is a list, with no "
                                         "options under it"),  # typed Any (a list or log): OmegaConf's traceback
        (["-m", "model.n_head=range(1,5,0)"], "error: model.n_head=range(1,5,0): range() arg 3 must not be zero; give "
                                              "range(start, stop, step) a step that is not 0"),  # Hydra's traceback
        (["-m", "model.n_head=range(5,1)"], "error: model.n_head=range(5,1): the sweep gives no value, so no run would "
                                            "start"),  # "Launching 0 jobs locally", exit 0
        (["-m", "experiment=glob(nope*)"], "error: experiment=glob(nope*): the glob matches none of experiment's options, "
                                           "so no run would start; experiment's options are: finetune_gpt2, "),  # 0 jobs, exit 0
        (["-m", "model.n_head=glob(*)"], "error: model.n_head=glob(*): glob() picks options of a config group by name "
                                         "(model, data, tokenizer, optim, train, experiment); model.n_head is no group"),
        (["-m", "model.n_head=choice()"], "error: model.n_head=choice(): choice() gives no value, so no run would start; "
                                          "list the values, e.g. model.n_head=choice(a,b)\n"),  # was the quoting hint
        (["model.n_head.x=1"], "error: model.n_head.x=1: model.n_head holds one value, with no options under it; give "
                               "model.n_head=<value>"),  # OmegaConf's words: "model.n_head={} must be a whole number"
        (["model.n_layer=10000000", "train.device=cpu"], "error: model.n_layer=10000000, model.n_embd=128: a model of 2,010.2B parameters, whose "
                                     "float32 weights and gradients take 16,081.9 GB, more than this machine's"),  # was killed
        (["model.n_embd=30", "model.n_head=4"], "error: model.n_embd=30 is not divisible by model.n_head=4"),
        (["model.n_kv_head=3"], "error: model.n_kv_head=3 does not divide model.n_head=4: each key/value head serves "
                                "n_head // n_kv_head query heads; pick model.n_kv_head from [1, 2, 4]"),
        (["model.n_kv_head=8"], "error: model.n_kv_head=8 is more than model.n_head=4: each key/value head serves "
                                "n_head // n_kv_head query heads; pick model.n_kv_head from [1, 2, 4]"),
        (["experiment=qwen3_shape", "model.n_head=3", "model.n_embd=96"], "error: model.n_kv_head=2, set by "
         "experiment=qwen3_shape, does not divide model.n_head=3: each"),  # a value the user never typed: whence it came
        (["experiment=qwen3_shape", "model.n_head=3", "model.n_embd=96", "model.n_kv_head=2"], "error: model.n_kv_head=2 "
         "does not divide model.n_head=3: each"),  # typed: said as typed
        (["experiment=mistral_shape", "model.pos=learned", "model.block_size=64"], "error: model.window=64, set by "
         "experiment=mistral_shape, hides nothing: no query sees more than model.block_size=64 tokens"),
        (["model.window=0"], "error: model.window=0 must be at least 1, or null"),
        (["model.pos=learned", "model.window=128"], "error: model.window=128 hides nothing: no query sees more than "
         "model.block_size=128 tokens, and with model.pos=learned generation never looks further back; pick a window "
         "under 128, or null"),
        (["train.batch_size=0"], "error: train.batch_size=0 must be at least 1"),
        (["train.batch_size=1000000000000", "train.device=cpu"], "error: train.batch_size=1000000000000: a micro-step of "
         "1,000,000,000,000 sequences of 128 tokens needs at least 1,304,"),  # 10^7 unchecked: killed, no word
        (["train.grad_accum_steps=1000000000000"], "error: train.grad_accum_steps=1000000000000: an update draws its "
         "micro-steps' 16,000,000,000,000 sequences of 128 tokens at once, and their token ids alone take at least "),  # "lower batch_size"
        (["data.cache_dir="], "error: data.cache_dir= is empty; give the folder that keeps the token cache (the default is "
                              ".cache)\n"),  # was the working folder, filled with tokens/
        (["optim.lr=-1"], "error: optim.lr=-1"),
        (["optim.lr=1e-320"], "error: optim.lr=1e-320 is under float32's smallest normal number (1.18e-38): float32 holds it "
                              "as 0, or with a few bits of precision; give one such as optim.lr=1e-3\n"),  # trained nothing
        (["optim.grad_clip=1e-40"], "error: optim.grad_clip=1e-40 is under float32's smallest normal number (1.18e-38): "
                                    "float32 holds it as 0, or with a few bits"),
        (["model.dropout=1.5"], "error: model.dropout=1.5 must be in [0, 1)"),
        (["data=text"], "error: data=text needs a corpus"),
        (["data=text", "data.path=nowhere.txt"], "error: data.path=nowhere.txt does not exist"),
        (["data=text", "data.path=pipe.txt"], "error: data.path=pipe.txt is neither a file nor a folder; give a .txt"),  # a named pipe
        (["data=shakespeare", "data.path=a_folder"], "error: data.path=a_folder is a folder, not a file; give the path of a local copy"),
        (["data=text", "data.path=empty.txt"], "error: data.path=empty.txt holds no text"),
        (["data=text", "data.path=blank.jsonl"], "error: data.path=blank.jsonl holds no text (every file is empty or blank, "
                                                 "or every 'text' of its .jsonl lines)"),
        (["data=text", "data.path=blank.txt"], "error: data.path=blank.txt holds no text (every file is empty or blank"),
        (["data=text", "data.path=loop.txt"], "error: data.path=loop.txt is a link that leads nowhere (to a path that does "
                                              "not exist, or round in a loop)"),  # was "does not exist"
        (["data=text", "data.path=binary.txt"], "error: binary.txt looks binary (it holds NUL bytes at 5)"),
        (["data=text", "data.path=latin1.txt"], "error: latin1.txt is not UTF-8 text (byte 3 is 0xe9)"),
        (["data=text", "data.path=bad.jsonl"], "error: bad.jsonl, line 2: not valid JSON (Expecting ',' delimiter, column 16)"),
        (["data=text", "data.path=bad.jsonl", "data.text_field=story"], "error: bad.jsonl, line 1: no 'story' field (it has 'text')"),
        (["data=text", "data.path=cut.txt.gz"], "error: cut.txt.gz is not a readable gzip file"),
        pytest.param(["train.device=cuda"], "error: train.device=cuda but PyTorch sees no CUDA GPU here",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")),
        (["optim.lr=0"], "error: optim.lr=0"),
        (["model.pos=alibi"], "error: model.pos=alibi must be one of learned, rope"),
        (["model.pos=rope", "model.n_embd=36", "model.n_head=4"], "error: model.pos=rope needs an even head size (it turns each "
         "pair of dimensions); n_embd // n_head is 9: make it even, e.g. model.n_embd=40"),
        (["model.mlp=swish"], "error: model.mlp=swish must be one of gelu, gelu_tanh, relu2"),
        (["optim.name=sgd"], "error: optim.name=sgd must be one of adamw, muon"),
        (["optim.schedule=step"], "error: optim.schedule=step must be one of cosine, wsd"),
        (["experiment=fast"], "error: experiment=fast is not an option of experiment; choose one of: finetune_gpt2, finetune_smollm2, gpt2_shape, induction, llama_shape, mistral_shape, qwen3_shape, shakespeare_char_cpu"),
        (["resume=nowhere"], "error: resume=nowhere does not exist"),
        (["resume=pipe.txt"], "error: resume=pipe.txt is neither a file nor a folder; give a run dir"),  # a named pipe
        (["resume=auto"], "error: resume=auto goes on with the run in hydra.run.dir, a new folder each time unless you name it: "
                          "add hydra.run.dir=<folder>"),
        (["train.save_interval=-1"], "error: train.save_interval=-1 must be 0 (only at evaluations) or more"),
        (["train.keep_checkpoints=[0,-50]"], "error: train.keep_checkpoints=[0,-50] holds -50: a step is 0 (the weights "
                                             "before any update) or more"),
        (["train.keep_checkpoints=logs"], "error: train.keep_checkpoints=logs is neither a list of steps nor log: give a "
                                          "list of steps, e.g. train.keep_checkpoints=[0,50,100], or train.keep_checkpoints=log"),
        (["train.keep_checkpoints=[0,2.5]"], "error: train.keep_checkpoints=[0,2.5] holds 2.5, which is not a whole number"),
        (["model.block_size=5000", "data.n_chars=20000"], "error: model.block_size=5000 needs more than 5000 tokens"),
        (["train.max_steps=abc"], "error: train.max_steps=abc must be a whole number"),
        (["model.bias=maybe"], "error: model.bias=maybe must be true or false (the config has model.bias=false)\n"),
        (["--config-name=nope"], "error: Cannot find primary config 'nope'."),
        (["~model.n_head=2,4"], "error: ~model.n_head=2,4: a comma here means a sweep; add -m for one run per value\n"),
        (["model.window=4,8"], "error: model.window=4,8: a comma here means a sweep; add -m for one run per value\n"),  # int or null
        (["model.pos=learned,rope"], "error: model.pos=learned,rope: a comma here means a sweep; add -m for one run per value\n"),
        (["tokenizer.path=x"], "error: tokenizer.path is not an option; check its spelling"),  # init_from's, no file's
        (["model.qk_norm=1.5"], "error: model.qk_norm=1.5 must be true or false"),
        (["debug=shape"], "error: debug=shape is not a debug mode; the one there is: debug=shapes"),
        (["train.compile=yes please"], "error: train.compile=yes please must be true or false"),
        (["model.dropout=x"], "error: model.dropout=x must be a number"),
        (["optim.betas=[2,0.9]"], "error: optim.betas=[2, 0.9] must be two numbers in [0, 1)"),
        (["optim.muon_momentum=1"], "error: optim.muon_momentum=1 must be in [0, 1)"),
        (["data.n_chars=0"], "error: data.n_chars=0 must be a whole number of at least 10000"),
        (["data.path=my_book.txt"], "error: data.path=my_book.txt is not read by data=stories, the built-in stories; add "
                                    "data=text to train on your file"),
        (["train.sample_temperature=-1"], "error: train.sample_temperature=-1 must be 0 (greedy) or a number from 1e-30 up"),
        (["train.sample_tokens=10000000000000"], "error: train.sample_tokens=10000000000000 is more than one sample may be "
                                                 "(100,000,000 tokens); ask for fewer"),  # once a traceback at step 0's sample
        (["model.n_layer=null"], "error: model.n_layer=null must be a whole number"),  # as typed: not Python's None
        (["debug=true"], "error: debug=true is not a debug mode; the one there is: debug=shapes"),
        (["train.device=null"], "error: train.device=null: train.device cannot be null; give it a value"),
        (["train.seed=-1"], "error: train.seed=-1 must be a whole number from 0 to 4294967295"),
        (["train.seed=4294967296"], "error: train.seed=4294967296 must be a whole number from 0 to 4294967295"),
        (["optim.lr=inf"], "error: optim.lr=inf must be a number greater than 0"),
        (["model.rope_theta=inf"], "error: model.rope_theta=inf must be a number greater than 0"),
        (["model.norm_eps=1e300"], "error: model.norm_eps=1e+300 must be a small number greater than 0, e.g. 1e-6, or null"),
        (["model.pos=learned", f"model.rope_scaling={LLAMA3}"], "error: model.rope_scaling={'factor': 8, 'low_freq_factor': "
         "1, 'high_freq_factor': 4, 'original_max_position_embeddings': 8192} scales rotary positions, and "
         "model.pos=learned; drop it, or set model.pos=rope"),
        ([f"model.rope_scaling={LLAMA3.replace('factor:8', 'factor:inf')}"],
         "error: model.rope_scaling.factor=inf: it must be a positive number, e.g. 'model.rope_scaling={factor:8,"),
        ([f"model.rope_scaling={LLAMA3.replace('high_freq_factor:4', 'high_freq_factor:1')}"],
         "error: model.rope_scaling.high_freq_factor=1: it must be greater than low_freq_factor=1, e.g."),
        ([f"model.rope_scaling={LLAMA3.replace('8192', '16.5')}"],
         "error: model.rope_scaling.original_max_position_embeddings=16.5: it must be a whole number of tokens, e.g."),
        (["train.device=tpu9"], "error: train.device=tpu9"),
        (["tokenizer=bpe", "tokenizer.vocab_size=100"], "error: tokenizer.vocab_size=100 must be a whole number from 256"),
        (["tokenizer=char", "tokenizer.vocab_size=100"], "error: tokenizer.vocab_size is not an option of the tokenizer chosen; "
                                                         "tokenizer=bpe has it\n"),
        (["resume=nowhere", "tokenizer=char", "tokenizer.vocab_size=100"],  # the group here is not yet the run's own
         "error: tokenizer.vocab_size is not an option of the tokenizer chosen; tokenizer=bpe has it (with resume=, give the "
         "run's group as well, e.g. tokenizer=bpe)\n"),
        (["model.foo.bar=1"], "error: model.foo is not an option; check its spelling"),  # a key below a key that is not there
        (["model="], "error: model=: model is a group of configs; give one of its options by name, one of: gpt\n"),
        (["model=1"], "error: model=1: model is a group of configs; give one of its options by name, one of: gpt\n"),
        (["data=null"], "error: data=null: data is a group of configs; give one of its options by name, one of: shakespeare, "
                        "stories, text\n"),  # Hydra: a traceback, for these three
        (["experiment=[induction]"], "shakespeare_char_gpu (or leave out experiment=, for none)\n"),
        (["-m", "model=1,2"], "error: model=1,2: model is a group of configs; give one of its options by name, one of: gpt\n"),
        (["hydra.mode=FOO"], "error: hydra.mode=FOO must be one of RUN, MULTIRUN\n"),  # an enum of Hydra's own
        # Hydra reads an empty folder as the one the command runs in: the run's files would land beside train.py.
        (["hydra.run.dir=", "train.max_steps=1"], "error: hydra.run.dir= is empty, which would put the run's files in the "
                                                  "folder the command runs in; give a folder (or, for a new run, leave "
                                                  "hydra.run.dir out: a new one under outputs/)\n"),
        (["-m", "hydra.sweep.dir=", "train.max_steps=1,2"], "error: hydra.sweep.dir= is empty, which would put the sweep's "
                                                            "files in the folder the command runs in; give a folder (or, for a new "
                                                            "sweep, leave hydra.sweep.dir out: a new one under multirun/)\n"),
        (["hydra/job_logging=nope"], "error: hydra/job_logging=nope is not an option of hydra/job_logging; choose one of: "
                                     "default, disabled, none, stdout, train\n"),
        (["data.n_chars=20000,30000"], "error: data.n_chars=20000,30000: a comma here means a sweep; add -m for one run per "
                                       "value\n"),  # a number, in the data group's schema
        (["optim.betas={a:1}"], "error: optim.betas: Error merging override optim.betas={a:1}; Cannot merge DictConfig with "
                                "ListConfig (`python train.py --help` lists every option)\n"),  # the cause's words too
        (["data.text_field=body"], "error: data.text_field is not an option of the data chosen; data=text has it"),
        (["tokenizer=char", "tokenizer.url=x"], "error: tokenizer.url is not an option of the tokenizer chosen; tokenizer=gpt2 has it"),
        (["tokenizer=gpt2", "tokenizer.url=http://127.0.0.1:9/gpt2", "data.cache_dir=c"],
         "error: could not download http://127.0.0.1:9/gpt2/vocab.bpe"),
        (["data=shakespeare", "data.url=http://127.0.0.1:9/input.txt", "data.cache_dir=c"],
         "error: could not download http://127.0.0.1:9/input.txt"),
    ],
)
def test_bad_training_input_gets_one_clear_line_and_no_traceback(tmp_path, args, message):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("  \n\t\n" * 100)
    (tmp_path / "loop.txt").symlink_to("loop.txt")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": ""}\n')
    (tmp_path / "binary.txt").write_bytes(b"hello\0\0\0world")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"text": "two" "three"}\n{"text": "four"}\n')
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"a story " * 1000)[:-40])  # a download cut short
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "a_folder").mkdir()
    made = set(tmp_path.iterdir())
    result = run_cli("train.py", *args, cwd=tmp_path)
    assert_one_error_line(result, message)
    assert set(tmp_path.iterdir()) <= made | {tmp_path / ".cache"}  # a refused run leaves no run dir, not even an empty one
    if "data=text" in args:  # a corpus refused while read leaves no token cache entry, whole or half-written
        assert not list(tmp_path.glob(".cache/tokens/*"))


def test_a_corpus_of_a_few_characters_is_one_line_though_a_split_holds_no_tokens(tmp_path):
    # "hello": 3 tokens to train on and none to validate on (an empty file, which mmap refuses).
    (tmp_path / "tiny.txt").write_text("hello\n")
    result = run_cli("train.py", "data=text", "data.path=tiny.txt", cwd=tmp_path)
    # Both splits are named: a block_size under 3 would only be refused next for the val split.
    assert_one_error_line(result, "error: model.block_size=128 needs more than 128 tokens in each split, but the train split has 3 "
                                  "and the val split has 0; use a longer corpus")
    assert not (tmp_path / "outputs").exists()
    # A val split too short for a window of the train split's: the share held out is the lever.
    (tmp_path / "short.txt").write_text("hello there, how are you today? " * 40)
    short_val = run_cli("train.py", "data=text", "data.path=short.txt", "tokenizer=char", "model.block_size=16",
                        "data.val_fraction=0.01", cwd=tmp_path)
    assert_one_error_line(short_val, "split has 12; raise data.val_fraction (the share of the text held out for it), use a longer corpus, "
                                     "or a model.block_size under 12")


@pytest.mark.slow  # the shared trained run
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run=nowhere"], "error: run=nowhere does not exist"),
        (["run=empty_run"], "error: run=empty_run has no checkpoint (ckpt_best.pt, ckpt_last.pt or one it kept)"),
        (["run=truncated.pt"], "error: truncated.pt is not a readable checkpoint"),
        (["run=notes.pt"], "error: notes.pt is not a readable checkpoint"),
        (["run=mismatched.pt"], "error: the checkpoint's weights do not fit the model its config describes"),
        (["run=alibi.pt"], "error: the checkpoint's config does not describe a model this version can build "
                           "(pos='alibi' is not one of ('learned', 'rope')); use a checkpoint train.py saved, as it saved it"),
        (["run=three_heads.pt"], "error: the checkpoint's config does not describe a model this version can build (n_embd="),
        (["run=no_model.pt"], "error: the checkpoint's config has no model group; use a checkpoint train.py saved, as "
                              "it saved it"),
        (["run=text_config.pt"], "error: text_config.pt is not a checkpoint of this project (its config is str, not dict); "
                                 "use one train.py saved, as it saved it"),
        (["top_p=0"], "error: top_p=0 must be in (0, 1]"),
        (["topk=5"], "error: topk is not an option; check its spelling (`python sample.py --help`"),
        (["temperature=-1"], "error: temperature=-1"),
        (["temperature=inf"], "error: temperature=inf must be 0 (greedy) or a number from 1e-30 up"),
        (["seed=99999999999999999999"], "error: seed=99999999999999999999 must be a whole number from 0 to 9223372036854775807"),
        (["seed=9223372036854775808"], "error: seed=9223372036854775808 must be a whole number from 0 to 9223372036854775807"),
        (["seed=-1"], "error: seed=-1 must be a whole number from 0 to 9223372036854775807"),
        (["prompt=Chapter", "1:", "x"], "error: could not read the argument '1:': each argument is key=value, and a value with"),
        (["run=~/runs/a"], "error: could not read the argument 'run=~/runs/a': Hydra's syntax claims ~; quote the value "
                           "inside the shell's quotes, e.g. 'run=\"~/runs/a\"'"),
        (["prompt=Once upon a time, a"], "error: prompt=Once upon a time, a: a comma here means a sweep; add -m for one run "
                                         "per value, or quote the value to keep it whole ('prompt=\"a, b\"')"),
        (["prompt='a','b'"], "error: prompt='a','b': a comma here means a sweep"),
        (["prompt=[a]"], "error: prompt: [ ] make a list of a value; to keep them as text, quote the value inside the "
                         "shell's quotes, e.g. 'prompt=\"[a]\"'"),
        (["device=tpu9"], "error: device=tpu9 is not a device; use auto, cpu, cuda"),
        (["top_k=100000"], "error: top_k=100000 must be between 1 and the vocabulary size"),
        (["top_p=1.5"], "error: top_p=1.5 must be in (0, 1]"),
        (["-m", "run=glob(*)"], "error: run=glob(*): glob() picks options of a config group by name, and this command has "
                                "none; run is no group, so no run would start: give the values themselves, e.g. run=a,b\n"),
        (['prompt="${x}"'], "error: prompt: Interpolation key 'x' not found; a value's ${...} names another key, and \\${ "
                            "keeps it as text, e.g. 'prompt=\\${x}'\n"),  # was the --help hint
        (["max_new_tokens=-3"], "error: max_new_tokens=-3 must be a whole number, 0 or more"),
        (["max_new_tokens=abc"], "error: max_new_tokens=abc must be a whole number"),
        (["top_k=lots"], "error: top_k=lots must be a whole number"),
        (["use_kv_cache=maybe"], "error: use_kv_cache=maybe must be true or false (the config has use_kv_cache=true)\n"),
        (["run=latest", "top_k=3,5"], "error: top_k=3,5: a comma here means a sweep; add -m for one run per value\n"),
        (["temperature=1e-45"], "error: temperature=1e-45 is too small to divide float32 logits by; give 0 for greedy "
                                "decoding, or at least 1e-30"),  # sampled NUL bytes, token 0, every time
        (["run=/dev/null"], "error: run=/dev/null is neither a file nor a folder; give a run dir"),  # was: does not exist
        (["prompt.x=a"], "error: prompt.x=a: prompt holds one value, with no options under it; give prompt=<value>"),
        (["prompt={a:1}"], "error: prompt: { } make a dict of a value; to keep them as text, quote the value inside the "
                           "shell's quotes, e.g. 'prompt=\"{a}\"'"),
        (['run=~/"a b"'], "error: could not read the argument 'run=~/\"a b\"': each argument is key=value"),  # quoted already
        (["run=latest", "num_samples=1.5"], "error: num_samples=1.5 must be a whole number (the config has num_samples=1)"),
        (["run=latest", 'temperature="2"'], "error: temperature=2 must be a number (the config has temperature=0.6)"),
        (["compile=true", "use_kv_cache=false"], "error: compile=true compiles the cached one-token step"),
        # Checked before any checkpoint is looked for (here there is none): run=latest would print which
        # run it picked first, a second line.
        (["run=latest", "num_samples=0"], "error: num_samples=0 must be at least 1"),
        (["run=latest", "max_new_tokens=10000000000000"], "error: num_samples=1 x max_new_tokens=10000000000000 is more "
                                                         "than one command samples (100,000,000 tokens); ask for fewer"),
        (["run=latest", "num_samples=100000000", "max_new_tokens=5"], "error: num_samples=100000000 x max_new_tokens=5 is more"),
        (["run=latest", "num_samples=200000000", "max_new_tokens=0"], "error: num_samples=200000000 x max_new_tokens=0 is more"),
        (["run=latest", "top_k=-3"], "error: top_k=-3 must be a whole number, 1 or more (0 or null: off)"),
        (["run=latest", "dtype=fp8"], "error: dtype=fp8 is not a precision; use auto, fp32, bf16 or fp16"),
    ],
)
def test_bad_sampling_input_gets_one_clear_line_and_no_traceback(trained_run, tmp_path, args, message):
    checkpoint = (trained_run / "ckpt_last.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(checkpoint[: len(checkpoint) // 2])
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    (tmp_path / "empty_run").mkdir()
    wrong = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
    wrong["config"]["model"]["n_embd"] = 64  # the config now describes another model than the weights
    torch.save(wrong, tmp_path / "mismatched.pt")
    # Edited by hand: a value no model has (once a model with no positions at all, and no word), a split
    # no model can make, a group gone, a config that is text (each once a traceback).
    for name, edit in [("alibi", lambda c: c["config"]["model"].update(pos="alibi")),
                       ("three_heads", lambda c: c["config"]["model"].update(n_head=3)),
                       ("no_model", lambda c: c["config"].pop("model")),
                       ("text_config", lambda c: c.update(config="hello"))]:
        edited = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
        edit(edited)
        torch.save(edited, tmp_path / f"{name}.pt")
    run = [] if any(a.startswith("run=") for a in args) else [f"run={trained_run}"]
    before = sorted(p.name for p in trained_run.rglob("*"))
    result = run_cli("sample.py", *run, *args, cwd=tmp_path)
    assert_one_error_line(result, message)
    assert sorted(p.name for p in trained_run.rglob("*")) == before  # nothing written into the run dir


def run_with_memory(gib: int, script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """script run with args, its address space held to gib GiB: a machine with that much memory left."""
    def small_machine() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib * 2**30, gib * 2**30))

    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          preexec_fn=small_machine)


@pytest.mark.slow  # the shared trained run
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the address-space limit stops CUDA's own start "
                    "first, with a warning of its own (sample.py's line for a GPU's out of memory was seen on an H200)")
def test_more_samples_at_once_than_memory_holds_is_one_line(trained_run, tmp_path):
    # Under the 100 million tokens sample.py takes at once, but 20 million rows of one batch: its
    # first forward asks for gigabytes. The address space held to 6 GB stands for a smaller machine.
    result = run_with_memory(6, "sample.py", f"run={trained_run}", "device=cpu", "num_samples=20000000", "max_new_tokens=5",
                             cwd=tmp_path)
    assert_one_error_line(result, "error: num_samples=20000000 continuations of max_new_tokens=5 tokens, sampled together "
                                  "as one batch, need more memory than this machine has; ask for fewer num_samples")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the address-space limit stops CUDA's own start "
                    "first")
def test_a_model_whose_weights_the_memory_left_cannot_hold_is_one_line(tmp_path):
    # 6.4 GB of weights: within what the check before building allows on a machine of 13 GB or
    # more, but not within the 2 GB of address space that stands for the memory left here.
    args = tiny_run(**{"tokenizer": "char", "model.n_layer": 2, "model.n_embd": 8192, "model.n_head": 64, "hydra.run.dir": "run"})
    result = run_with_memory(2, "train.py", *args, cwd=tmp_path)
    assert_one_error_line(result, "error: model.n_layer=2, model.n_embd=8192: ")
    assert "make" in result.stderr and "smaller" in result.stderr  # the check's line or the build's, by the machine
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the address-space limit stops CUDA's own start "
                    "first")
def test_a_training_step_that_runs_out_of_memory_is_one_line_that_names_the_batch(tmp_path):
    # Every head's (T, T) scores of the explicit attention, 4,096 x 16 x 512 x 512 float32 (69 GB), past
    # the 2 GB of address space that stands for the memory here, while the check before the run counts
    # the logits only (4,096 x 512 tokens x 8 bytes for each of the char vocabulary's ~60: about 1 GB).
    args = tiny_run(**{"tokenizer": "char", "model.attention": "manual", "model.n_head": 16, "model.n_embd": 64,
                       "model.block_size": 512, "train.batch_size": 4096, "hydra.run.dir": "run"})
    result = run_with_memory(2, "train.py", *args, cwd=tmp_path)
    assert_one_error_line(result, "error: memory ran out while training on cpu (one allocation asked for ")
    assert " GB), with micro-steps of train.batch_size=4096 sequences of model.block_size=512 tokens; lower train.batch_size " \
           "(train.grad_accum_steps=N" in result.stderr
    assert result.stderr.endswith(", or use model.attention=sdpa, which never holds every head's (T, T) scores at once\n")
    assert (tmp_path / "run" / "train.log").exists()  # the run had started: its record stays


def test_running_out_of_memory_with_many_micro_steps_names_them_too():
    # An update draws its micro-steps' ids at once: the line said to raise train.grad_accum_steps, the cause.
    from training.build import ran_out_of_memory

    spec = tiny_spec(**{"train.grad_accum_steps": 1000, "train.batch_size": 4})
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                       "68719476736 bytes. Error code 12 (Cannot allocate memory)")
    gpu = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB")
    assert "on cpu (one allocation asked for 68.7 GB), with" in ran_out_of_memory(spec, torch.device("cpu"), cpu)
    assert ran_out_of_memory(spec, torch.device("cuda"), gpu).startswith(
        "the GPU's memory ran out while training on cuda (one allocation asked for 2.00 GiB), with micro-steps")
    assert ran_out_of_memory(spec, torch.device("cpu")) == (
        "memory ran out while training on cpu, with micro-steps of train.batch_size=4 sequences of model.block_size=32 "
        "tokens, train.grad_accum_steps=1000 of them drawn at once for each update; lower train.batch_size, "
        "model.block_size or train.grad_accum_steps")
    assert "train.grad_accum_steps=N adds up N micro-steps" in ran_out_of_memory(tiny_spec(), torch.device("cpu"))


def test_a_batch_whose_token_ids_pass_this_machines_memory_is_refused_on_a_gpu_too():
    # A GPU run draws its batches here before they move: with no check, train.batch_size=10^12 on an
    # H200 machine ended the process without a word. The logits live on the GPU, whose running out
    # train.py words when it comes (ran_out_of_memory), so they are counted on the CPU alone.
    from runtime.devices import memory_bytes
    from training.build import check_batch_fits

    memory, gpu, cpu = memory_bytes(), torch.device("cuda"), torch.device("cpu")  # no GPU is touched
    too_many = tiny_spec(**{"train.batch_size": memory // (32 * 32) + 1}).step  # 32 tokens of 32 bytes each
    with pytest.raises(UserError, match=rf"^train.batch_size={too_many.batch_size}: an update draws {too_many.batch_size:,} "
                                        r"sequences of 32 tokens at once, and their token ids alone take at least [\d,.]+ GB, "
                                        r"more than this machine's [\d.]+ GB of memory; lower train.batch_size$"):
        check_batch_fits(too_many, 100, gpu)
    wide = tiny_spec(**{"train.batch_size": 1000}).step  # 1,000 x 32 tokens' logits of a vocabulary that takes past memory
    check_batch_fits(wide, memory // (1000 * 32 * 8) + 1, gpu)
    with pytest.raises(UserError, match=r"^train.batch_size=1000: a micro-step .* for its logits and their gradients"):
        check_batch_fits(wide, memory // (1000 * 32 * 8) + 1, cpu)


@pytest.mark.parametrize("script", ["train.py", "sample.py", "export.py"])
def test_a_python_without_the_projects_packages_gets_one_line_that_names_the_venv(tmp_path, script):
    # A python where hydra is not installed (as a system python is): the script, run as Python runs it.
    run = f"import runpy, sys; sys.modules['hydra'] = None; sys.argv = [{script!r}]; runpy.run_path({script!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: hydra is not installed for this python ({sys.executable}); run .venv/bin/python {script} "
                             "(make setup makes .venv), or activate .venv first\n")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_run_whose_console_is_a_full_disk_says_so_once_and_trains_to_the_end(tmp_path):
    # The console's handler as Hydra sets it up from configs/hydra/job_logging/train.yaml (logging's own
    # printed a traceback for every line); tests/test_run_dir.py tries the handler on a closed pipe too.
    args = tiny_run(**{"tokenizer": "char", "hydra.run.dir": "run", "train.sample_interval": 0, "train.attn_log_interval": 0})
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("warning: the console's output could not be written (No space left on device); the run goes "
                             "on, and train.log in its run dir keeps every line (Ctrl-C stops it, saving)\n")
    assert "done: best val loss" in (tmp_path / "run" / "train.log").read_text()


def test_a_key_under_a_lists_index_a_dict_or_hydras_own_passes_the_check_of_keys_under_values(monkeypatch):
    # What check_keys_under_values must let through to Hydra, as train.py is given it.
    import cli.schema  # noqa: F401 (stores train.py's schemas, as train.py imports them)

    monkeypatch.setattr(sys, "argv", ["train.py"])
    check_keys_under_values(["optim.betas.0=0.95", "hydra.job.env_set.FOO=1", "+hydra.job.env_set.BAR=2", "~data.path",
                             "model.rope_scaling.factor=8", "-m", "model.n_head=1,2", "data=text", "data.path=a.txt"])
    with pytest.raises(UserError, match=re.escape("data.path.x=1: data.path holds one value")):
        check_keys_under_values(["data=text", "data.path.x=1"])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_output_sent_to_a_full_disk_is_one_line(tmp_path):
    # `python train.py --help > help.txt` with no space left: Hydra's print of the help text fails.
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], cwd=tmp_path, stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ("error: writing failed: No space left on device (the output, or a file the command writes); "
                             "free some space, or send the output elsewhere, and run it again\n")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv to run without root's file access")
def test_a_corpus_the_user_may_not_read_is_one_line_that_does_not_ask_for_write_access(tmp_path):
    # The tests run as root, who reads any file: setpriv drops the capabilities that let root past a file's mode.
    (tmp_path / "locked.txt").write_text("a corpus nobody may read " * 100)
    (tmp_path / "locked.txt").chmod(0)
    as_a_user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    result = subprocess.run([*as_a_user, sys.executable, str(ROOT / "train.py"), "data=text", "data.path=locked.txt"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert_one_error_line(result, "error: locked.txt: permission denied; give a path this user may use, or change its permissions")
    assert not (tmp_path / "outputs").exists()


def test_a_folder_the_run_cannot_make_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "notes.txt").write_text("a file where the run wants a folder")
    for key, made in (("hydra.run.dir", "notes.txt"), ("data.cache_dir", "notes.txt/bpe")):
        result = run_cli("train.py", *tiny_run(**{"debug": "shapes", key: "notes.txt"}), cwd=tmp_path)
        assert_one_error_line(result, f"error: {made} cannot be made a folder: a file is in the way; give another path")
    result = run_cli("train.py", *tiny_run(**{"debug": "shapes", "data.cache_dir": "/proc/no-such-folder"}), cwd=tmp_path)
    assert_one_error_line(result, "error: /proc/no-such-folder: No such file or directory; give another path")  # no [Errno 2]


def test_hydra_full_error_1_brings_back_the_tracebacks_and_0_leaves_the_one_line(tmp_path, monkeypatch):
    line = "error: model.n_layr is not an option; check its spelling"
    for asked in ("0", "1"):
        monkeypatch.setenv("HYDRA_FULL_ERROR", asked)
        misspelt = run_cli("train.py", "model.n_layr=3", cwd=tmp_path)
        unmade = run_cli("train.py", "hydra.run.dir=/proc/no-such-folder/run", cwd=tmp_path)  # made by Hydra, before the run
        assert os.environ["HYDRA_FULL_ERROR"] == asked  # as it was (run_cli sets it to 1 while it runs)
        if asked == "0":
            assert_one_error_line(misspelt, line)
            assert unmade.returncode == 2 and "Traceback" not in unmade.stderr
        else:
            assert misspelt.returncode == 1 and "Traceback" in misspelt.stderr and line not in misspelt.stderr
            assert "hydra.errors.ConfigCompositionException: Could not override 'model.n_layr'." in misspelt.stderr
            assert unmade.returncode == 1 and "FileNotFoundError" in unmade.stderr


def test_an_override_of_hydras_own_settings_goes_to_hydra(tmp_path):
    for added in ("+hydra.job.env_set.FOO=bar", "++hydra.job.env_set.FOO=bar"):  # (+model... is refused: the table above)
        result = run_cli("train.py", "--cfg", "hydra", added, cwd=tmp_path)
        assert result.returncode == 0 and "  env_set:\n      FOO: bar\n" in result.stdout, result.stderr


def test_make_says_arg_without_an_s_is_no_variable_rather_than_run_the_defaults():
    # `make train ARG="..."` trained the default model for minutes, its settings unread.
    result = subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", "train", "ARG=train.max_steps=1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not result.stdout
    assert 'ARG= is no variable here: extra arguments go through ARGS= (with an S), e.g. make train ARGS=' in result.stderr
