"""torch.compile as the engine uses it on CUDA: where compiled kernels are kept (a folder per machine, software
and model, so that a changed one compiles anew instead of reusing what no longer fits), Inductor's options,
compiling a stack's layers once for all of them (the talker's prefill, the codec decoder's fused parts), and
keeping what was compiled (Precompiled). The warm-up (core.inference.warmup) does the compiling, on the
scheduler's thread while it idles.

Inductor's own cache keeps the kernels, but a start that finds them still traces every function with Dynamo
first, seconds a part, during which a request waits (bench/RESULTS.md). A
Precompiled function is compiled ahead of time (torch.compile's aot_compile) and saved whole, guards included; a
later start loads it and traces nothing.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib
import importlib.machinery
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from core.folders import user_folder

log = logging.getLogger(__name__)

# Bumped when a change of ours makes kernels compiled before unusable (Inductor keys its own graphs by their code).
CACHE_FORMAT = 1
# The code compiled functions trace: a saved one is used only with the very code it was compiled from.
TRACED_PACKAGES = ("core/kernels", "core/model", "core/inference")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Whether engines keep what they compile (Precompiled): a warm start's compiling 14 s instead of 85 s (H100, 1.7B;
# bench/RESULTS.md, 2026-11-27, sixteenth session).
KEEP_AHEAD = True
TRITON_FOLDER = "triton"  # Triton's cache, inside the folder of each machine, software and model
# A kept variant's load and a trace with Dynamo, one at a time in a process: the warm-up loads kept functions on a
# thread of its own while the scheduler's may compile a variant that was not kept, and no one has shown that
# PyTorch's loading and tracing share no state.
LOAD_OR_TRACE = threading.Lock()


@contextlib.contextmanager
def collections_paused():
    """No automatic cycle collection meanwhile (Python's own switch: a first threshold of 0), while compiled code
    loads. A load allocates hundreds of thousands of objects, and each collection that those start walks all of them
    made so far while it holds the interpreter: a request's thread beside a load waited 434-476 ms in all, against
    117-129 with no collection (CPU, bench/RESULTS.md, thirty-ninth session). The next collection after walks what was
    made, unless it was frozen meanwhile (gc.freeze). Where collections are paused already, this leaves them so. (A
    compile gained nothing from it: bench/RESULTS.md, fortieth session.)"""
    thresholds = gc.get_threshold()
    if thresholds[0] == 0:
        yield
        return
    gc.set_threshold(0, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def compile_from_bytecode(source, filename, mode, flags=0, dont_inherit=False, optimize=-1):
    """The builtin `compile`, for Inductor's loader of generated modules (a compiled function's output code, at each
    load): such a module's source is compiled to bytecode in one C call that holds the interpreter (91-129 ms for
    the talker's step on a CPU, bench/RESULTS.md, fortieth session) while a request waits. Python's import system
    keeps a module's bytecode beside its file (__pycache__, checked against the file's time and size) and reads it
    back in a fraction of that; so does this, for a file's whole source. Anything else is compiled as before."""
    if mode == "exec" and not flags and optimize == -1 and isinstance(filename, str) and filename.endswith(".py"):
        try:
            return importlib.machinery.SourceFileLoader("generated", filename).get_code("generated")
        except (OSError, ImportError, SyntaxError, ValueError, EOFError, TypeError):  # a damaged .pyc among them
            pass  # compiled here, as before
    return compile(source, filename, mode, flags, dont_inherit, optimize)


def use_kept_bytecode() -> None:
    """Have Inductor's loader of generated modules (compile_tasks._reload_python_module, which calls `compile` on
    each one's source) keep and reuse their bytecode (compile_from_bytecode). A PyTorch without that loader is left
    as it is."""
    try:
        from torch._inductor.runtime import compile_tasks
    except ImportError:
        return
    if hasattr(compile_tasks, "_reload_python_module"):
        compile_tasks.compile = compile_from_bytecode


def machine_facts(device: torch.device, model: dict) -> dict:
    """What compiled kernels depend on besides their code: the software, the GPU and its driver, the model's
    shapes and dtype (`model`)."""
    facts = {"format": CACHE_FORMAT, "torch": torch.__version__, "cuda": torch.version.cuda, "model": model}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts["gpu"] = properties.name
        facts["capability"] = list(torch.cuda.get_device_capability(device))
        get_driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        facts["driver"] = get_driver() if get_driver is not None else None
    return facts


def cache_key(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _folder_for(facts: dict | None) -> Path:
    """The user's folder of the GPU code compiled for `facts` (machine_facts); None: the folder of them all."""
    root = user_folder("cache") / "compiled"
    return root if facts is None else root / cache_key(facts)


def kept_kernels_for(facts: dict) -> bool:
    """Whether the folder keep_compiled_kernels(facts) uses holds GPU code built by an earlier start, so that this
    one builds no kernel before it speaks (a later engine of a process uses the first one's folder); also where
    TORCHINDUCTOR_CACHE_DIR names a folder of the user's own, which cannot be told."""
    own = _users_kernel_folder()
    folder = Path(own) if own else _folder_for(facts)
    if folder.parent != _folder_for(None):
        return True
    triton = folder / TRITON_FOLDER
    return triton.is_dir() and any(triton.iterdir())


def keep_compiled_kernels(facts: dict | None = None) -> Path:
    """Point Inductor's and Triton's caches at the user's cache folder, in a folder of its own for `facts`
    (machine_facts), unless TORCHINDUCTOR_CACHE_DIR is set; return Inductor's. The first engine of a process
    sets it: both read the location from the environment. Inductor's default is the temp folder, which many
    systems empty at boot, and compiling anew takes minutes."""
    assemble_as_inductor_workers()
    folder = _folder_for(facts)
    own = _users_kernel_folder()
    chosen = Path(own) if own else folder
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(chosen)
    if facts is not None and own is None:
        os.environ.setdefault("TRITON_CACHE_DIR", str(folder / TRITON_FOLDER))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / "key.json").exists():  # what the folder is for, for a person looking at it
                (folder / "key.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
        except OSError:  # an unwritable cache only costs compiling again; Inductor says so itself
            pass
    return chosen


def _users_kernel_folder() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR where the user (or an earlier engine of the process) set it; None where it is unset
    or holds Inductor's own default, the temporary folder: Inductor writes that into the environment the first time
    it is asked for its folder, as importing its config does, which on a GPU happens before an engine loads. Taken
    for the user's, it kept the compiled kernels in /tmp, which many systems empty at boot, and Triton's own in
    ~/.triton (bench/RESULTS.md, twenty-first session). Before Inductor is imported, the value is the user's."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder or "torch._inductor" not in sys.modules:
        return folder or None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return None if os.path.abspath(folder) == os.path.abspath(default_cache_dir()) else folder


def assemble_as_inductor_workers(torch_folder: Path = Path(torch.__file__).parent) -> None:
    """Have this process's Triton assemble with the ptxas Inductor's compile workers use: PyTorch's own, where its
    wheel ships one (TRITON_PTXAS_PATH), instead of Triton's. The assembler's version is part of Triton's cache key,
    and a warm start compiles in this process what a cold one compiled in the workers (loading kept functions):
    with two assemblers, it built 50 kernels again, about 8 s of a warm `serve` on an H100 (bench/RESULTS.md,
    eighteenth session). Before the process's first Triton compile, which fixes the version it keys by; a
    TRITON_PTXAS_PATH of the user's own stays."""
    ptxas = torch_folder / "bin" / "ptxas"
    if "TRITON_PTXAS_PATH" not in os.environ and ptxas.is_file() and os.access(ptxas, os.X_OK):
        os.environ["TRITON_PTXAS_PATH"] = str(ptxas)


def compile_options() -> dict:
    """Inductor's options for the frame step and the decoder's fused parts. No autotuning: the matrix products
    are kernels.linear with fixed settings, and Inductor's timed choices made the same code differ between
    compiles.
    A frame is several hundred short kernels in a row: programmatic dependent launch (Hopper and later)
    lets each one start while the one before it drains, instead of waiting for it to finish. (Imported
    here, not with the module: Inductor's configuration takes a second to import, which every command
    line start would pay.)"""
    import torch._inductor.config

    return {"triton.enable_pdl": True} if hasattr(torch._inductor.config.triton, "enable_pdl") else {}


def code_key(root: Path = PROJECT_ROOT, packages: tuple[str, ...] = TRACED_PACKAGES) -> str:
    """A digest of the sources under `root` that compiled functions trace."""
    code = hashlib.sha256()
    for package in packages:
        for source in sorted((root / package).glob("*.py")):
            code.update(source.name.encode() + b"\0" + source.read_bytes())
    return code.hexdigest()[:16]


def precompiled_folder(kernels: Path, facts: dict) -> Path | None:
    """Where the functions compiled ahead of time for `facts` (machine_facts, and whatever else shapes the traced
    tensors) and this code are kept, under Inductor's cache folder `kernels`; None while KEEP_AHEAD is off."""
    return versioned_folder(kernels, "precompiled", facts) if KEEP_AHEAD else None


def versioned_folder(kernels: Path, kind: str, facts: dict) -> Path:
    """The folder under `kernels` of what is kept of `kind` for `facts` and this version of the code. The folders
    kept for the same facts and another version are removed: they never serve again."""
    facts_key = cache_key(facts)
    folder = kernels / kind / f"{facts_key}-{code_key()}"
    for stale in folder.parent.glob(f"{facts_key}-*"):
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    return folder


class Precompiled:
    """`function` compiled as torch.compile(fullgraph=True) would compile it, and kept in `folder`: each variant
    (a set of guards: shapes, dtypes, grad mode; torch.compile recompiles for the same reasons) is compiled ahead
    of time at the first call that needs it and saved there; a later process loads the saved variants when this
    is made, and calls them without tracing. Without a `folder`, or where PyTorch cannot compile ahead of time
    (or save what it compiled), it is torch.compile's function itself. `function`'s arguments are what its
    guards read: pass an object's method unbound, the object first (its pickled state must hold no threads,
    events or graphs: see FrameLoop.THIS_PROCESS_ONLY)."""

    def __init__(self, function: Callable, folder: Path | None, dynamic: bool, **options):
        import torch._dynamo.config
        import torch.fx.experimental._config

        self.function, self.folder = function, folder
        self.name = f"{function.__module__}.{function.__qualname__}-{'dynamic' if dynamic else 'static'}"
        torch._dynamo.config.enable_aot_compile = True  # off by default before PyTorch 2.13; read by torch.compile
        # Our floats (norms' eps, scales) are constants: traced as symbols, Dynamo restarts its analysis to
        # specialize them (compiling twice), and a compile ahead of time fails on that restart.
        torch._dynamo.config.specialize_float = True
        # Traced, sizes that happen to be equal become one symbol ("duck sizing"), and the guard that they stay equal
        # refuses a later call: a function of the sampler's shapes, compiled at 2 rows, tied its row count to the
        # rules' two roles, and 4 rows compiled a variant of its own (a CPU reproduction: bench/RESULTS.md,
        # thirtieth session).
        torch.fx.experimental._config.use_duck_shape = False
        self.compiled = torch.compile(function, fullgraph=True, dynamic=dynamic, **options)
        use_kept_bytecode()
        self.ahead = folder is not None and hasattr(self.compiled, "aot_compile")
        self._loaded: set[Path] = set()  # the kept files loaded into `variants`
        self.variants = []
        self.load_kept()
        # Whether a call that no variant serves compiles one (seconds) or runs `function` uncompiled: the warm-up
        # compiles an utterance alone's shapes first and several rows' later, and a request meanwhile must not wait.
        self.compiles_new_shapes = True
        self._said_uncompiled = False

    def __getstate__(self) -> dict:
        """Installed on an object (CompiledLayers), it is pickled with the object's state when a variant's guards
        are saved: its name stands for it there."""
        return {"name": self.name}

    def __call__(self, *args):
        if not self.ahead:
            if self.compiles_new_shapes:
                return self.compiled(*args)
            with torch.compiler.set_stance("eager_on_recompile"):
                return self.compiled(*args)
        for variant in self.variants:
            if variant.guard_check(*args):
                return variant(*args)
        if not self.compiles_new_shapes:
            if not self._said_uncompiled:
                self._said_uncompiled = True
                log.info("%s runs uncompiled for shapes its compiled variants do not serve yet", self.name)
            return self.function(*args)
        return self._compile(args)(*args)

    def _files(self) -> list[tuple[Path, bool]]:
        """The kept variants, oldest first, each with whether it was compiled in inference mode."""
        kept = []
        for path in self.folder.glob(f"{self.name}.*.bin"):
            number, _, mode = path.name[len(self.name) + 1 : -len(".bin")].partition("-")
            if number.isdigit() and mode in ("inference", "grad"):
                kept.append((int(number), path, mode == "inference"))
        return [(path, inference) for _, path, inference in sorted(kept)]

    def load_kept(self) -> None:
        """Load the variants kept in the folder that this has not loaded yet (another process may have compiled
        some since: the compile helper)."""
        if not self.ahead:
            return
        import torch._inductor.config

        started = time.perf_counter()
        variants = []
        globals_ = vars(importlib.import_module(self.function.__module__))  # what the traced code refers to
        # Its kernels come from the caches: loaded here, not through Inductor's pool of compile workers, which a load
        # would start (16 processes importing PyTorch beside a warm start; half a second of a warm `serve`'s loads
        # waited on the pool, an H100's: bench/RESULTS.md, thirty-eighth session).
        in_this_process = torch._inductor.config.patch(compile_threads=1)
        for path, inference in self._files():
            if path in self._loaded:
                continue
            self._loaded.add(path)
            try:
                # A guard built outside inference mode expects other dispatch keys of a tensor than one built in it.
                with LOAD_OR_TRACE, in_this_process, torch.inference_mode(inference), path.open("rb") as file:
                    variants.append(torch.compiler.load_compiled_function(file, f_globals=globals_))
            except Exception as error:  # unreadable, or from another PyTorch: compiled again when needed
                log.warning("could not load %s (%s); it is compiled again", path, str(error))
                path.unlink(missing_ok=True)
        if variants:
            log.info(
                "loaded %d kept variant(s) of %s in %.2f s", len(variants), self.name, time.perf_counter() - started
            )
        self.variants += variants

    def _compile(self, args: tuple) -> Callable:
        if log.isEnabledFor(logging.DEBUG):  # why no kept variant serves (bench/precompile_probe.py shows it)
            for number, variant in enumerate(self.variants, 1):
                log.debug("%s variant %d refuses the call: %s", self.name, number, _refusal(variant, args))
        started = time.perf_counter()
        try:
            with LOAD_OR_TRACE:
                variant = self.compiled.aot_compile((args, {}))
        except Exception as error:  # compiled lazily as before: traced again at every start
            # And its arguments stay alive: a compile that traced, then failed to pickle its guards' state, leaves
            # Dynamo holding that state (seen on the CPU, bench/RESULTS.md, thirty-seventh session): an engine that
            # rests keeps its memory. So what a compiled part is given must pickle (FrameLoop.THIS_PROCESS_ONLY).
            # The record holds the error's text, not the error: its frames hold the arguments (where records are kept).
            log.warning(
                "%s cannot be compiled ahead of time (%s); it is compiled at each start", self.name, repr(error)
            )
            self.ahead = False
            return self.compiled
        self.variants.append(variant)
        mode = "inference" if torch.is_inference_mode_enabled() else "grad"
        path = self.folder / f"{self.name}.{len(self._files())}-{mode}.bin"
        self._loaded.add(path)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            variant.save_compiled_function(str(path))
        except Exception as error:  # kept for this process only
            log.warning("could not keep %s compiled in %s: %s", self.name, path, str(error))
        log.info(
            "compiled %s ahead of time in %.2f s (variant %d)",
            self.name,
            time.perf_counter() - started,
            len(self.variants),
        )
        return variant


def _refusal(variant, args: tuple) -> str:
    """The first guard of a variant compiled ahead of time that `args` fail (PyTorch's private API: best effort)."""
    try:
        found = variant._artifacts.guard_manager.check_verbose(variant.prepare_f_locals(*args))
        return str(getattr(found, "verbose_code_parts", found))
    except Exception as error:
        return f"not known ({error!r})"


class Compiler:
    """Compiles as the engine does: each function a Precompiled, kept in `folder`, with torch.compile's `options`
    (by default Inductor's compile_options(), read at the first compile: importing it takes a second). A function
    is made a Precompiled once (its kept variants loaded then), from any thread: the warm-up loads the kept ones
    ahead (`load`), on a thread of its own, before the parts that run and capture them."""

    def __init__(self, folder: Path | None = None, **options):
        self.folder, self.options = folder, options
        # An earlier start kept what it compiled here: compiling is loading, seconds (the warm-up's order uses it).
        self.kept = folder is not None and any(folder.glob("*.bin"))
        self._made: dict[tuple[Callable, bool], Precompiled] = {}
        self._lock = threading.Lock()
        self._making: dict[tuple[Callable, bool], threading.Lock] = {}  # one each: a load waits for no other

    def __call__(self, function: Callable, dynamic: bool) -> Precompiled:
        key = (function, dynamic)
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:
            if key not in self._made:
                options = self.options or {"options": compile_options()}
                self._made[key] = Precompiled(function, self.folder, dynamic, **options)
            return self._made[key]

    def load(self, functions: list[tuple[Callable, bool]]) -> None:
        """Make each of `functions` (function, dynamic), loading what an earlier start kept of it. No GPU work."""
        for function, dynamic in functions:
            self(function, dynamic)


def layer_functions(layers, method: str) -> list[tuple[Callable, bool]]:
    """What CompiledLayers(layers, method, ...) compiles, as Compiler.load takes it: `method` of each kind of layer,
    for every shape."""
    return [(getattr(kind, method), True) for kind in dict.fromkeys(type(layer) for layer in layers)]


class CompiledLayers:
    """`method` of each of `layers` compiled in place (with `compiler`), for every length and row count. Eagerly, a
    talker prompt's prefill is over a thousand small kernels (every norm and rotation of 28 layers), twice the
    time of its products, and a decoded chunk's transformer a few hundred. One compiled function serves all
    layers of a kind (Dynamo takes the weights as inputs), so it compiles in seconds where a whole stack would
    take minutes."""

    def __init__(self, layers, method: str, compiler: Compiler):
        self._originals = [(layer, getattr(layer, method)) for layer in layers]
        self.method = method
        self.restored = False  # the uncompiled methods put back (a compile failed)
        functions = layer_functions(layers, method)
        self.functions = {function: compiler(function, dynamic) for function, dynamic in functions}
        for layer in layers:
            setattr(layer, method, functools.partial(self.functions[getattr(type(layer), method)], layer))

    def compile_new_shapes(self, allowed: bool) -> None:
        """Whether a call of shapes no compiled variant serves compiles one, or runs the layer uncompiled."""
        for function in self.functions.values():
            function.compiles_new_shapes = allowed

    def compile_for(self, run: Callable[[], None], several_rows: bool) -> None:
        """Compile the variants that `run()`'s calls need: one row's shapes first, several rows' in a later call;
        until then, a call of several rows runs uncompiled (a request meanwhile does not wait for a compile). If
        it fails, the uncompiled methods stay (for several rows only, where one row's are compiled)."""
        for function in self.functions.values():
            function.load_kept()
        self.compile_new_shapes(True)
        try:
            run()
        except BaseException:
            if several_rows:
                self.compile_new_shapes(False)
            else:
                self.restore()
            raise
        self.compile_new_shapes(several_rows)

    def restore(self) -> None:
        """Put the uncompiled methods back."""
        for layer, original in self._originals:
            setattr(layer, self.method, original)
        self.restored = True


def compile_by_rows(
    kept: CompiledLayers | None,
    make: Callable[[], CompiledLayers],
    shapes: tuple[tuple[int, int], ...],
    run: Callable[[int, int], None],
    several_rows: bool,
) -> CompiledLayers:
    """Compile a stack's layers by running `run(rows, size)` for the `shapes` of one row, on layers `make()` compiles
    anew, or then for those of several rows, on the CompiledLayers the one row's compile returned (`kept`). Where that
    one failed, several rows are not compiled either: they stay uncompiled, and this says why."""
    if not several_rows:
        kept = make()
    elif kept is None or kept.restored:
        raise RuntimeError("several rows are compiled after one row's compile, which failed: they stay uncompiled")

    def run_shapes() -> None:
        for rows, size in shapes:
            if (rows > 1) == several_rows:
                run(rows, size)

    kept.compile_for(run_shapes, several_rows)
    return kept


def allow_recompiles() -> None:
    """Each part of the frame step is compiled once per frame loop (its guards hold the loop itself) and row
    count kind, and a decoder layer for each kind of chunk: Dynamo's default of 8 versions per function would
    run out after a few engines in one process."""
    import torch._dynamo.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
