"""One module per registered cache kind, named as the kind: ``write(folder, number)`` writes one
whole entry of the kind (the ``number``-th; each different) into the kind's folder and returns
its key as the kind's scan names it. A tiered kind's module also has ``fetch(tier, key)`` and
``promote(tier, key)``: the startup hook's node-local tier (``gpu_cache_hook.tier.Tier``) moving
that entry as the kind's hook piece moves it. A carried kind's module may have
``recorded(keys)``: the part of a hook's record that names those entries as used (by default
the kind's section with ``hit_keys``). The contract suite (tests/test_kind_contract.py)
runs its faults and attacks on every kind through these; a new kind adds its module here with
its own tests."""
