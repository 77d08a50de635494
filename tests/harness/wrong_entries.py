"""Well-formed but wrong cache entries, as a torn group or a bad promotion would leave them in a
trusted root (issue 40): each keeps its own key and shape and holds what another program of the
same signature compiled to. The outputs proof must catch each (tests/test_outputs_proof.py, and
on a GPU tests/benchmarks/outputs_proof.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

#: ``jit(plus_one)(ones(3))``, its outputs written to the file named by the first argument.
PLUS_ONE = ("import sys, jax, jax.numpy as jnp, numpy as np\n"
            "def plus_one(x):\n"
            "    return x + 1\n"
            "np.save(sys.argv[1], np.asarray(jax.jit(plus_one)(jnp.ones(3, jnp.float32))))\n")
#: Another function of the same signature: its executable is well formed, and wrong for plus_one.
HUNDRED = ("import jax, jax.numpy as jnp\n"
           "def hundred(x):\n"
           "    return x * 0 + 100\n"
           "print(jax.jit(hundred)(jnp.ones(3, jnp.float32)))\n")
#: A dense layer, ``tanh(x @ w + b)``, its outputs written to the first argument; its bias is
#: half a percent of the outputs' magnitude, so the same layer without it is wrong by under 1%
#: (issue 47: such an entry passed a 1% tolerance). Its inputs are numpy's, so the layer is
#: the one program it compiles.
DENSE = ("import sys, jax, jax.numpy as jnp, numpy as np\n"
         "def dense(x, w, b):\n"
         "    return jnp.tanh(x @ w + b)\n"
         "x = np.sin(np.arange(16 * 64, dtype=np.float32)).reshape(16, 64)\n"
         "w = np.cos(np.arange(64 * 32, dtype=np.float32)).reshape(64, 32) * np.float32(0.5)\n"
         "b = np.full(32, 0.005, np.float32)\n"
         "np.save(sys.argv[1], np.asarray(jax.jit(dense)(x, w, b)))\n")
#: The same layer's signature without its bias (``keep_unused``: its executable still takes ``b``).
DENSE_WITHOUT_BIAS = ("import jax, jax.numpy as jnp, numpy as np\n"
                      "def dense_without_bias(x, w, b):\n"
                      "    return jnp.tanh(x @ w)\n"
                      "x, w, b = (np.ones(s, np.float32) for s in ((16, 64), (64, 32), 32))\n"
                      "print(jax.jit(dense_without_bias, keep_unused=True)(x, w, b).shape)\n")
#: The dense layer itself compiled with another ``jax_default_matmul_precision`` (full FP32
#: where the default lets a GPU use TF32): its entry planted under the default's key is what a
#: key that misses that flag serves. XLA on the CPU computes the same bits for every precision.
DENSE_HIGHEST = ("import jax, jax.numpy as jnp, numpy as np\n"
                 "jax.config.update('jax_default_matmul_precision', 'highest')\n"
                 "def dense(x, w, b):\n"
                 "    return jnp.tanh(x @ w + b)\n"
                 "x, w, b = (np.ones(s, np.float32) for s in ((16, 64), (64, 32), 32))\n"
                 "print(jax.jit(dense)(x, w, b).shape)\n")
#: Two graphs of one signature under torch.compile; the outputs are both results.
TWO_GRAPHS = ("import sys, torch, numpy as np\n"
              "def plus_one(x):\n"
              "    return torch.sin(x) + 1\n"
              "def hundred(x):\n"
              "    return torch.cos(x) * 100\n"
              "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
              "x = torch.ones(8, device=device)\n"
              "found = {f.__name__: torch.compile(f, dynamic=False)(x).cpu().numpy()\n"
              "         for f in (plus_one, hundred)}\n"
              "np.savez(sys.argv[1], **found)\n")


def plant_jax(jax_folder: Path, name: str, program: str, other: str, scratch: Path,
              environ: dict[str, str]) -> str:
    """Copy the executable of ``other`` that ``program`` compiles (in ``environ``, with its own
    cache in ``scratch``) over the entry of ``name`` in ``jax_folder``: the key it replaced."""
    (target,) = jax_folder.glob(f"{name}-*-cache")
    env = dict(environ, JAX_COMPILATION_CACHE_DIR=str(scratch),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (wrong,) = scratch.glob(f"{other}-*-cache")
    shutil.copyfile(wrong, target)
    return target.name[:-len("-cache")]


def triton_groups(root: Path, kernel: str) -> list[Path]:
    """The key folders of ``kernel`` (by name) in the root's Triton cache."""
    return sorted(p.parent for p in (root / "triton").glob(f"*/{kernel}.cubin"))


def tear_triton(group: Path, donor: Path) -> str:
    """Make ``group`` a torn Triton group: its kernel binary is ``donor``'s, another
    specialisation of the same kernel (same signature), the rest its own. Its key."""
    (cubin,) = group.glob("*.cubin")
    cubin.write_bytes((donor / cubin.name).read_bytes())
    return group.name


def _payload(path: Path) -> bytes:
    """An entry's bytes without the digest frame the hook writes around it (the hook's digest.py)."""
    from gpu_cache._hook.gpu_cache_hook import digest

    data = path.read_bytes()
    return digest.opened(data) or data


def entries_of(folder: Path, kernel: str) -> list[Path]:
    """jax-triton entries (JSON files) of the kernel named ``kernel``."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                  and json.loads(_payload(p)).get("kernel") == kernel)


def swap_jax_triton_ptx(entry: Path, donor: Path) -> str:
    """Give a jax-triton entry ``donor``'s PTX (a torn write: the key and the rest its own), its
    digest made anew as a writer that wrote it so would. Its key."""
    from gpu_cache._hook.gpu_cache_hook import digest

    found, other = json.loads(_payload(entry)), json.loads(_payload(donor))
    found["result"]["binary"] = other["result"]["binary"]
    entry.write_bytes(digest.framed(json.dumps(found).encode("ascii")))
    return entry.name


def swap_ptxas_output(entry: Path, donor: Path) -> str:
    """Give a ptxas shim entry ``donor``'s cubin, its header (key, sizes) and digest made whole
    for it. Its key."""
    from gpu_cache._hook.gpu_cache_hook import digest

    magic, own = _payload(entry).split(b"\n", 1)
    key, sizes, meta, rest = own.split(b"\n", 3)
    out_n, err_n, _bin_n, seconds = sizes.split()
    other = _payload(donor).split(b"\n", 1)[1].split(b"\n", 3)
    other_out, other_err, _bin, _seconds = (int(v) if n < 3 else v for n, v in enumerate(other[1].split()))
    cubin = other[3][other_out + other_err:]
    head = b"%s\n%s %s %d %s\n%s\n" % (key, out_n, err_n, len(cubin), seconds, meta)
    entry.write_bytes(digest.framed(magic + b"\n" + head + rest[:int(out_n) + int(err_n)] + cubin))
    return entry.name[:-len(".ptxas")]


def swap_inductor_graph(inductor: Path) -> str:
    """In an Inductor folder holding :data:`TWO_GRAPHS`' two FX graphs, put hundred's code
    under plus_one's key. plus_one's key."""
    graphs = {b"cos(" in p.read_bytes(): p for p in (inductor / "fxgraph").glob("*/*/*")}
    assert len(graphs) == 2, graphs
    graphs[False].write_bytes(graphs[True].read_bytes())
    return graphs[False].parent.name


def ptxas_entries_of(folder: Path, kernel: str) -> list[Path]:
    """The ptxas shim's entries of kernels whose name holds ``kernel``: one kernel's
    specialisations share its symbol, so another's cubin loads and runs, wrongly."""
    from gpu_cache.core import kinds

    if not folder.is_dir():
        return []
    return sorted(folder / f"{e.key}.ptxas" for e in kinds.named("ptxas").scan(folder, grace_seconds=0.0)
                  if kernel in e.name and not e.problem)
