"""What every rule reads: one pass over a module and the facts derived from it.

Layers, lowest first (no import goes up): `source` (reading a file as Python does) and
`provenance` (which values depend on the rank) < `context` (ModuleInfo, the record of one
pass) < `walker` (the one traversal, `build`) < `ranks` (rank classes and how a test splits
them) < `crossfile` (the files linted together, FileSet) < `callgraph`, `paths` <
`runtime_tests` (tests no rank class decides) < `schedule` (each function's tree of what the
other ranks wait on) < `projection` (that tree walked for one rank class) < `consistent`
(path-by-path agreement) < `divergence` (aligning two classes' projections); `buffers` and
`nccl` answer narrower questions some rules share.
"""
