"""The tiny digits comparison the command-line tests share (two settings, 2 steps of a width-8 ViT).

Imported by the test modules (``tests/experiments/conftest.py`` puts this folder on ``sys.path``: pytest runs
with ``--import-mode=importlib``) at module level, where their ``parametrize`` lists read it.
"""

TINY_DIGITS_TOML = '''name = "tiny"
seeds = [0]
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
batch_size = 8
warmup_steps = 0
eval_interval = 2
log_interval = 1
checkpoint_interval = 2
[[operators]]
name = "attention"
[[operators]]
name = "lap"
laplacian_heads = 1
'''

# a two-seed character-LM comparison whose run folders the gaps tests write by hand (no training)
TINY_GAPS_TOML = """name = "g"
seeds = [0, 1]
[[tasks]]
name = "t"
dataset = "pydoc-chars"
model = "gpt-char-tiny"
metric = "val_loss"
[[operators]]
name = "attention"
[[operators]]
name = "lap"
laplacian_heads = 1
"""
