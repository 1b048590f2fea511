"""The data-parallel kinds, one module each, and their registry (``registry.KINDS``): how a
model's replicas make their gradients the global batch's, and what each of them shards.
"""
