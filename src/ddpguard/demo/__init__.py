"""`ddpguard demo`: a small byte-level language model trained on the standard library's own
docstrings, on 2 CPU ranks, with evaluation, checkpoints and resume (the README's main job)."""
