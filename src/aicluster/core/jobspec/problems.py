"""What can be wrong with a job spec: one problem, the error listing them, and the entrypoint
rule. See :mod:`aicluster.core.jobspec`."""

from __future__ import annotations

from aicluster.core.configfile import ConfigError

__all__ = ["FieldError", "JobSpecError", "SpecProblem", "UnsafeEntrypoint", "check_entrypoint"]


class FieldError(ValueError):
    """A cross-field check that failed, naming the field to blame (for the line number)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class UnsafeEntrypoint(ValueError):
    """An entrypoint that would run something else than a file of the job's shipped code."""


def check_entrypoint(path: str) -> None:
    """Refuse an entrypoint that is not a plain relative path inside the job's code: it runs as
    ``python -u PATH`` in the job's working directory, so ``-c``, an interpreter flag, an absolute
    path or ``..`` would run something else than the shipped file."""
    if any(char in path for char in "\x00\n\r\\"):
        raise UnsafeEntrypoint("must be a plain path (no NUL, line breaks or backslashes)")
    if path.startswith("-"):
        raise UnsafeEntrypoint(
            f"{path!r} looks like an interpreter flag: give a file of the job's code "
            "(or module: for python -m)"
        )
    if path.startswith("/") or path.startswith("~"):
        raise UnsafeEntrypoint(
            f"{path!r} is absolute: give a path inside the job's code (its workdir)"
        )
    parts = path.split("/")
    if ".." in parts:
        raise UnsafeEntrypoint(f"{path!r} leaves the job's code ('..'): give a path inside it")
    if all(part in ("", ".") for part in parts):
        raise UnsafeEntrypoint(f"{path!r} names no file")


class SpecProblem:
    """One thing wrong with a spec: the field path (``resources.gpus``), its line, the message."""

    __slots__ = ("field", "line", "message", "unsafe")

    def __init__(self, field: str, line: int | None, message: str, unsafe: bool = False) -> None:
        self.field, self.line, self.message = field, line, message
        self.unsafe = unsafe  # an entrypoint that would run something else than the job's code

    def __repr__(self) -> str:
        return f"SpecProblem({self.field!r}, {self.line!r}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class JobSpecError(ConfigError):
    """A job spec is invalid. ``problems`` lists every problem found; the message shows the
    first :data:`_SHOWN_PROBLEMS` (and how many more), the first as ``source:line: field:
    message``."""

    def __init__(self, source: str, problems: tuple[SpecProblem, ...]) -> None:
        self.problems = problems
        #: Whether the spec asks to run something else than its shipped code (the API: a 400).
        self.unsafe = any(problem.unsafe for problem in problems)
        first, rest = problems[0], problems[1:_SHOWN_PROBLEMS]
        lines = [str(first), *(_located(source, p) for p in rest)]
        if len(problems) > _SHOWN_PROBLEMS:  # 1,024 bad args: the answer stays small
            lines.append(f"{source}: and {len(problems) - _SHOWN_PROBLEMS} more problems")
        super().__init__(source, first.line, "\n".join(lines))


_SHOWN_PROBLEMS = 20


def _located(source: str, problem: SpecProblem) -> str:
    where = f"{source}:{problem.line}" if problem.line else source
    return f"{where}: {problem}"
