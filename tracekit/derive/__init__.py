"""Facts computed once from the run store, below every analyzer: topology (ranks → hosts → mesh
coordinates, groups → dims), matched collectives and clock offsets, each rank's activity intervals,
host ops, the pipeline's P2P graph. They import only the tables, the parser's vocabulary, the findings
types and the layout vocabulary; analyzers, the what-if replay and the exports read them.
"""
