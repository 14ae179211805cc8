"""Compile the mapping's hot modules with mypyc as the extensions are built (everything else is in pyproject.toml).

The mapping is typed, pure Python; compiled, an assembly worker builds a conversation in about 30 % less CPU
(`python bench/worker_build.py`). Optional like the C walk: without mypy or a working C compiler, or when mypyc
refuses the code, the package installs and runs the same modules as Python. mypyc runs only when the extensions are
built (never for metadata or an sdist), over a tree of links in the build directory where the files sit at their
module paths (`tracejudge/mapping/...`), as mypy names modules. All or nothing: a build that leaves any compiled
module out removes them all, since each imports the shared runtime and a compiled class cannot be subclassed by an
interpreted one. The sources' hashes are written beside them (`mapping/_compiled.json`): `mapping/compiled.py`
imports the sources instead of extensions built from other text.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# mapping/ modules a conversation is built with (relative to mapping/); they import one another natively
COMPILED = ("spans.py", "stored_spans.py", "messages.py", "conversation.py", "conversation_key.py", "log_events.py",
            "envelopes.py", "results.py", "dialects/*.py")
PACKAGE = "tracejudge.mapping"
SHARED_LIBRARY = f"{PACKAGE}._compiled"  # mypyc's runtime for them, inside the package (`_compiled__mypyc`)
MANIFEST = "_compiled.json"  # beside the compiled modules: the hash of each source they were built from
OPT_LEVELS = ("0", "1", "2", "3")  # the C compiler's -O; 3 unless TRACEJUDGE_MYPYC_OPT_LEVEL says (0 builds ~3x faster)


def _sources() -> list[Path]:
    return sorted({path for pattern in COMPILED for path in (ROOT / "mapping").glob(pattern)})


def _shadow_tree(top: Path) -> list[str]:
    """tracejudge/ (the scoring package's files) with mapping/ inside it, as links: the compiled files' paths."""
    shutil.rmtree(top, ignore_errors=True)
    package = top / "tracejudge"
    package.mkdir(parents=True)
    for entry in (ROOT / "scoring").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "mapping").symlink_to(ROOT / "mapping")
    return [str(Path("tracejudge", "mapping", path.relative_to(ROOT / "mapping"))) for path in _sources()]


class BuildWithMypyc(build_ext):
    """The extensions of pyproject.toml, and the mapping compiled by mypyc where it can be."""

    def run(self) -> None:
        compiled = [] if os.environ.get("TRACEJUDGE_NO_MYPYC") else self._mypyc_extensions()
        for extension in compiled:  # what setuptools' finalize_options does for the extensions it was given
            extension._full_name = self.get_ext_fullname(extension.name)
            self.ext_map[extension._full_name] = extension
            extension._links_to_dynamic = extension._needs_stub = False
            extension._file_name = self.get_ext_filename(extension._full_name)
            self.extensions.append(extension)
            # an earlier build's output must not count as this one's (the all-or-nothing check below)
            Path(self.build_lib, extension._file_name).unlink(missing_ok=True)
        super().run()
        if compiled and all(Path(self.build_lib, e._file_name).exists() for e in compiled):
            self._write_manifest()
        else:
            if compiled:
                self.warn("a compiled mapping module failed to build: the mapping runs as Python")
            self._remove()

    def _mypyc_extensions(self) -> list[Any]:
        try:
            from mypyc.build import mypycify
        except ImportError:
            self.warn("mypy is not installed: the mapping runs as Python (pip install mypy, then build again)")
            return []
        temp = Path(self.build_temp).resolve() / "mypyc"
        if not self._compiler_works(temp):
            self.warn("no working C compiler: the mapping runs as Python")
            return []
        opt_level = os.environ.get("TRACEJUDGE_MYPYC_OPT_LEVEL", "3")
        if opt_level not in OPT_LEVELS:
            self.warn(f"TRACEJUDGE_MYPYC_OPT_LEVEL={opt_level!r} is not one of {', '.join(OPT_LEVELS)}: using 3")
            opt_level = "3"
        here = os.getcwd()
        try:
            files = _shadow_tree(temp / "src")
            (temp / "mypy.ini").write_text("[mypy]\n")  # a user's own mypy configuration does not apply
            os.chdir(temp / "src")  # mypy names each module by its path from here
            extensions = mypycify([f"--config-file={temp / 'mypy.ini'}", "--follow-imports=skip",
                                   "--ignore-missing-imports", *files], opt_level=opt_level, group_name=SHARED_LIBRARY,
                                  target_dir=str(temp / "c"))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - mypy exits on a type error: the Python still works
            self.warn(f"mypyc could not compile the mapping ({exc or 'a type error, above'}): it runs as Python")
            return []
        finally:
            os.chdir(here)
        for extension in extensions:
            extension.optional = True  # a module that fails to compile must not fail the install (see `run`)
            extension.sources = [str((temp / "src" / s).resolve()) for s in extension.sources]
            extension.include_dirs = [str((temp / "src" / d).resolve()) for d in extension.include_dirs]
        return extensions

    def _compiler_works(self, temp: Path) -> bool:
        """Whether the C compiler builds a trivial file (`CC=false`, or none installed: it does not)."""
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.errors import CompileError, DistutilsExecError
        from setuptools._distutils.sysconfig import customize_compiler

        compiler = new_compiler()
        customize_compiler(compiler)
        temp.mkdir(parents=True, exist_ok=True)
        probe = temp / "probe.c"
        probe.write_text("int tracejudge_probe(void) { return 0; }\n")
        try:
            compiler.compile([str(probe)], output_dir=str(temp))
        except (CompileError, DistutilsExecError, OSError):
            return False
        return True

    def _package_dirs(self) -> list[Path]:
        """Where the mapping's built modules go: the build directory, and the sources' folder when in place."""
        dirs = [Path(self.build_lib, *PACKAGE.split("."))]
        if self.inplace or getattr(self, "editable_mode", False):
            dirs.append(Path(self.get_finalized_command("build_py").get_package_dir(PACKAGE)))
        return dirs

    def _write_manifest(self) -> None:
        hashes = {path.relative_to(ROOT / "mapping").as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
                  for path in _sources()}
        for folder in self._package_dirs():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / MANIFEST).write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")

    def _remove(self) -> None:
        """No compiled module, built now or left by an earlier build in place: the mapping runs as Python."""
        for folder in self._package_dirs():
            (folder / MANIFEST).unlink(missing_ok=True)
            names = [source.relative_to(ROOT / "mapping").with_suffix("") for source in _sources()]
            for name in [*names, Path(SHARED_LIBRARY.rsplit(".", 1)[1] + "__mypyc")]:
                for suffix in EXTENSION_SUFFIXES:
                    folder.joinpath(name.parent, name.name + suffix).unlink(missing_ok=True)


setup(cmdclass={"build_ext": BuildWithMypyc})
