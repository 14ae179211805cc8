"""Compile the mapping's hot modules with mypyc as the extensions are built (everything else is in pyproject.toml).

The mapping is typed, pure Python; compiled, an assembly worker builds a conversation in about a third less CPU
(`python bench/worker_build.py`). Optional like the C walk: without mypy or a C compiler the package installs and
runs the same modules as Python. mypyc runs only when extensions are built (not for an sdist or metadata), over a
shadow tree in build/ where the files sit at their module paths (`tracejudge/mapping/...`), as mypy names modules.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# mapping/ modules a conversation is built with (relative to mapping/); they import one another natively
COMPILED = ("spans.py", "messages.py", "conversation.py", "conversation_key.py", "log_events.py", "envelopes.py",
            "results.py", "dialects/*.py")
SHARED_LIBRARY = "tracejudge.mapping._compiled"  # mypyc's runtime for them, inside the package (`..__mypyc`)


def _shadow_tree(build_temp: Path) -> list[str]:
    """tracejudge/ (the scoring package's files) with mapping/ inside it, as links: the compiled files' paths."""
    top = build_temp / "mypyc-src"
    shutil.rmtree(top, ignore_errors=True)
    package = top / "tracejudge"
    package.mkdir(parents=True)
    for entry in (ROOT / "scoring").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "mapping").symlink_to(ROOT / "mapping")
    return sorted(str(path.relative_to(top)) for pattern in COMPILED for path in (package / "mapping").glob(pattern))


class BuildWithMypyc(build_ext):
    """The extensions of pyproject.toml, then the mapping compiled by mypyc where mypy and a C compiler are here."""

    def finalize_options(self) -> None:
        # before setuptools finalizes the extensions (and lists their outputs, as an editable install asks)
        modules = self.distribution.ext_modules = list(self.distribution.ext_modules or [])
        if not any(getattr(e, "mypyc", False) for e in modules) and not os.environ.get("TRACEJUDGE_NO_MYPYC"):
            modules.extend(self._mypyc_extensions())
        super().finalize_options()

    def _mypyc_extensions(self) -> list:
        try:
            from mypyc.build import mypycify
        except ImportError:
            self.warn("mypy is not installed: the mapping runs as Python (pip install mypy, then build again)")
            return []
        if not self._compiler_works():
            self.warn("no working C compiler: the mapping runs as Python")
            return []
        temp = ROOT / "build" / "mypyc"
        temp.mkdir(parents=True, exist_ok=True)
        files = _shadow_tree(temp)
        here = os.getcwd()
        os.chdir(temp / "mypyc-src")  # mypy names each module by its path from here
        try:
            extensions = mypycify(["--follow-imports=skip", "--ignore-missing-imports", *files], opt_level="3",
                                  group_name=SHARED_LIBRARY, target_dir=str(temp / "mypyc-c"))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - mypy exits on a type error: the Python still works
            self.warn(f"mypyc could not compile the mapping ({exc or 'a type error, above'}): it runs as Python")
            return []
        finally:
            os.chdir(here)
        for extension in extensions:
            extension.mypyc = True  # type: ignore[attr-defined]  # made once per build, however often finalized
            extension.optional = True  # a module that fails to compile leaves the Python one in use
            extension.sources = [str((temp / "mypyc-src" / source).resolve()) if not os.path.isabs(source)
                                 else source for source in extension.sources]
            extension.include_dirs = [str((temp / "mypyc-src" / d).resolve()) if not os.path.isabs(d) else d
                                      for d in extension.include_dirs]
        return extensions

    def _compiler_works(self) -> bool:
        """Whether the C compiler builds a trivial file (`CC=false`, or none installed: it does not)."""
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.errors import CompileError, DistutilsExecError
        from setuptools._distutils.sysconfig import customize_compiler

        compiler = new_compiler()
        customize_compiler(compiler)
        probe = ROOT / "build" / "mypyc" / "probe.c"
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("int tracejudge_probe(void) { return 0; }\n")
        try:
            compiler.compile([str(probe)], output_dir=str(probe.parent))
        except (CompileError, DistutilsExecError, OSError):
            return False
        return True


setup(cmdclass={"build_ext": BuildWithMypyc})
