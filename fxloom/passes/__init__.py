"""Analyses and transformations of fxloom graphs: the torch.fx paper's case studies.

One module per pass family; import the one you need (nothing is imported here, so a pass's
dependencies never slow down the others)::

    fxloom.passes.captured         what every consumer works on: a module traced, a GraphModule,
                                   an exported program (its module, or its graph and state)
    fxloom.passes.shape_prop       ShapeProp: tensor shapes/dtypes into node.meta (real or meta)
    fxloom.passes.cost             FLOPs, bytes, parameters, activation and peak memory
    fxloom.passes.fuse             conv/linear + batch-norm folding for inference
    fxloom.passes.matcher          SubgraphMatcher, and why a node does not match
    fxloom.passes.cse              common-subexpression elimination
    fxloom.passes.dce              dead code, unused submodules and attributes
    fxloom.passes.const_fold       constant folding into new attributes
    fxloom.passes.normalize        arguments to keyword form from operator signatures
    fxloom.passes.split_module     split_module: partitions as submodules
    fxloom.passes.split_by_support split_by_support: supported runs as submodules
    fxloom.passes.schedule         blocking calls into start/wait, overlapped
    fxloom.passes.graph_drawer     FxGraphDrawer: Graphviz drawings

(``fxloom.subgraph_rewriter.replace_pattern`` sits at the package's top level, as documented.)

Every pass says what it does to ``node.meta`` (keeps, recomputes or drops each key) and to
node names (kept, except for new nodes).

Depends on: the IR and ``fxloom.interpreter``; never on the CLI. (A plain module given to a
pass is traced by ``captured.trace``, which imports the tracer only then.)
"""
