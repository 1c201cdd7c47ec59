"""Capture: one training step of an ``nn.Module`` as a joint forward+backward graph, costed.

A model file is loaded (`frontends.capture.model_file`), its step traced by torch.export and
AOTAutograd (`frontends.capture.step`, with the edits of `export_passes` and `output_selection`,
`fakify` for meta-device models and `meta_capture` for any batch and dtype), long loops of
identical copies traced short and stitched back (`repeated_body`, `joint_stitch`), symbolic sizes
made concrete (`symbolic_sizes`); `step` builds the `RematGraph` and `costed_capture` prices its
ops under a named cost model.
"""
