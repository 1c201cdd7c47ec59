"""Split: row-chunk the largest activations of a language model before the joint graph is built.

`row_split` runs the LM head and its loss in chunks of token rows, `mlp_split` each transformer
MLP; both rewrite the exported forward so that AOTAutograd derives the chunked backward. The
eager runtime's and torch.compile's versions live with those runtimes
(`frontends.eager_runtime.eager_split`, `frontends.compile.compile_split`).
"""
