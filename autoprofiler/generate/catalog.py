"""The operator catalog: every op the generator composes, by name.

``CATALOG`` maps a name to its ``Op`` (``spec.py``); the ops themselves live in ``ops_dense.py``
(matmul/linear/bmm, convolutions, attention, embeddings), ``ops_pointwise.py`` (activations,
elementwise arithmetic, norms) and ``ops_shape.py`` (reductions, softmax/logsumexp, pooling, scans,
indexing, layout changes). A catalog is a plain dict: tests build their own with a broken op added.

>>> len(CATALOG) >= 40
True
>>> CATALOG["conv2d"].family, CATALOG["conv2d"].layouts
('conv', ('img2d',))
"""

from __future__ import annotations

from autoprofiler.generate import ops_dense, ops_pointwise, ops_shape
from autoprofiler.generate.spec import Op


def make_catalog(*groups: tuple[Op, ...]) -> dict[str, Op]:
    """A catalog from groups of ops; a name given twice is an error.

    Raises:
        ValueError: two ops share a name.
    """
    catalog: dict[str, Op] = {}
    for op in (op for group in groups for op in group):
        if op.name in catalog:
            raise ValueError(f"op name {op.name!r} is in the catalog twice")
        catalog[op.name] = op
    return catalog


CATALOG = make_catalog(ops_dense.OPS, ops_pointwise.OPS, ops_shape.OPS)
FAMILIES = tuple(sorted({op.family for op in CATALOG.values()}))
