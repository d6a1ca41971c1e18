"""debug=shapes: one forward of the configured model, traced line by line with every tensor's shape."""

import re

import pytest

from tests.helpers import ROOT, run_cli


def trace_steps(stdout: str) -> dict[str, str]:
    """The shape trace as {code of a line: the shapes printed under it} (the first time each appears)."""
    lines = stdout.splitlines()
    steps = {}
    for code, shape in zip(lines, lines[1:], strict=False):
        if shape.strip().startswith("-> ") and ".py:" in code:
            steps.setdefault(code.split(maxsplit=1)[1].split("  #")[0], shape.strip()[3:])
    return steps


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["model.n_layer=2", "model.n_head=4", "model.n_embd=32", "model.block_size=16", "tokenizer=char",
          "model.pos=learned"], {
            "x = self.hook_embed(self.tok_emb(idx))": "(2, 16, 32)",
            "q, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=2)": "(2, 16, 96) -> 3 x (2, 16, 32)",  # every step of a line
            "q = self.hook_q(q.view(B, T, H, D))": "(2, 16, 4, 8)",
            "q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)": "(2, 4, 16, 8)",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)": "(2, 4, 8, 16) -> (2, 4, 16, 16)",
            "weights = torch.softmax(scores, dim=-1)": "(2, 4, 16, 16)",
            "out = self.attn_dropout(weights) @ v": "(2, 4, 16, 16) -> (2, 4, 16, 8)",
            "z = self.hook_z(out.transpose(1, 2))": "(2, 16, 4, 8)",
            "out = z.contiguous().view(B, T, H * D)": "(2, 16, 4, 8) -> (2, 16, 32)",  # the copy, then the view
            "pre = self.hook_pre(self.fc(x))": "(2, 16, 96)",  # the default SwiGLU: 8/3 of 32, rounded up to 32
            "logits = self.lm_head(x)": "(2, 16, 50)",  # 49 characters and <|endoftext|>
        }),
        (["model.n_layer=3", "model.n_head=2", "model.n_embd=48", "model.block_size=12", "model.pos=rope",
          "model.qk_norm=true", "model.attention=manual"], {
            "q = self.hook_q(q.view(B, T, H, D))": "(2, 12, 2, 24)",
            "q, k = self.q_norm(q), self.k_norm(k)": "(2, 12, 2, 24)",
            "x1, x2 = x.chunk(2, dim=-1)": "2 x (2, 12, 2, 12)",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)": "(2, 2, 24, 12) -> (2, 2, 12, 12)",
            "pre = self.hook_pre(self.fc(x))": "(2, 12, 128)",  # 8/3 of 48
            "logits = self.lm_head(x)": "(2, 12, 1103)",  # the BPE vocabulary of the first 20,000 characters
        }),
        (["model.n_layer=2", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=32", "model.block_size=16",
          "tokenizer=char", "model.window=4", "model.mlp=swiglu"], {
            "q, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=2)": "(2, 16, 64) -> (2, 16, 32), (2, 16, 16), (2, 16, 16)",
            "k = self.hook_k(k.view(B, -1, K, D))": "(2, 16, 2, 8)",  # K = 2 key/value heads
            "visible = visible.triu(diagonal=S - T - window + 1)": "(16, 16)",  # the window's band
            "k = k.repeat_interleave(group, dim=1)": "(2, 4, 16, 8)",  # each shared by 2 query heads
            "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)": "(2, 4, 8, 16) -> (2, 4, 16, 16)",
            "pre = self.hook_pre(self.fc(x))": "(2, 16, 96)",  # SwiGLU: 8/3 of 32, rounded up to 32
            "h = F.silu(pre) * self.hook_pre_linear(self.up(x))": "(2, 16, 96)",
        }),
    ],
    ids=["4 heads of 8", "rope and qk-norm, 2 heads of 24", "4 query heads sharing 2 key/value heads, a window, swiglu"],
)
def test_debug_shapes_walks_one_forward_of_the_configured_model_and_writes_nothing(tmp_path, args, expected):
    result = run_cli("train.py", "debug=shapes", "data.n_chars=20000", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = trace_steps(result.stdout)
    for code, shape in expected.items():
        assert steps.get(code) == shape, (code, steps.get(code))
    assert ("sharing K=2 key/value heads" in result.stdout) == ("model.n_kv_head=2" in args)
    assert "self.pos_emb(positions)" in result.stdout if "model.pos=learned" in args else "pos_emb" not in result.stdout
    n_layer = int(args[0].split("=")[1])
    later = "blocks.1" if n_layer == 2 else f"blocks.1 to blocks.{n_layer - 1}"
    assert f"{later}: the same steps and shapes as blocks.0" in result.stdout
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())  # no run was made


def test_the_trace_docs_code_md_quotes_names_each_lines_real_number():
    # The quoted output names model/attention.py's lines by number: an edit above them moves them.
    quoted = re.findall(r"^  (\w+\.py):(\d+)  (.+)$", (ROOT / "docs/code.md").read_text(), re.MULTILINE)
    assert len(quoted) == 4
    for file, number, code in quoted:
        assert (ROOT / "model" / file).read_text().splitlines()[int(number) - 1].strip() == code, (file, number)
