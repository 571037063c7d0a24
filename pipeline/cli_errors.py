"""How the ``pipeline`` command reports what a user got wrong: one line, never a traceback.

A user's error (bad params, a missing or damaged file, a refused store, an unknown name) is
one red ``error:`` line and exit 1 (:func:`fail`); a command-line mistake (a value of the
wrong type, an unknown option) is one line naming the option, the value and the help
(:func:`usage_line`), exit 2; a warning is one ``warning:`` line. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import itertools

import typer

# What a user can cause (bad params, a missing or damaged file, a refused store, an unknown
# name): one line, exit 1. Anything else is a bug and keeps its traceback.
USER_ERRORS = (KeyError, ValueError, OSError, RuntimeError)


# The fix an OS error's own words leave unsaid, after the path it names.
OS_FIXES = (
    ((FileExistsError, NotADirectoryError), "a file stands where a folder is needed: remove it or point the params at another path"),
    (IsADirectoryError, "a folder stands where a file is needed: point the params at the file"),
    (PermissionError, "no permission to write or read there: choose a folder you can write, or fix its permissions"),
)
READ_ONLY = "the file system is read-only: point the params' output paths at a writable folder"


def fail(e: Exception) -> None:
    """Print a user's error as one red ``error:`` line (with the fix an OS error's own words
    leave unsaid) and exit 1."""
    fixes = [fix for kinds, fix in OS_FIXES if isinstance(e, kinds) and e.filename is not None]
    fixes = [READ_ONLY] if isinstance(e, OSError) and e.errno == errno.EROFS else fixes
    typer.secho("; ".join([f"error: {e}", *fixes[:1]]), fg=typer.colors.RED, err=True)
    raise typer.Exit(code=1)


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the CLI prints it: ``warning: <message>`` on one line (Python's default
    adds the file, line number and source line of the code that warned)."""
    return f"warning: {message}\n"


def given_value(argv: list[str], opts: list[str]) -> str | None:
    """What the command line gave an option (``--batch-size abc`` or ``--batch-size=abc``),
    for naming it in the one-line error; None when it is not found."""
    for i, token in enumerate(argv):
        for opt in opts:
            if token == opt and i + 1 < len(argv):
                return argv[i + 1]
            if token.startswith(opt + "="):
                return token[len(opt) + 1 :]
    return None


# What Ctrl-C prints: an interrupted extract keeps its rows, so the same command resumes it.
RESUME = "rerun the same command; an extract resumes where it stopped, keeping every row it wrote"


def usage_line(e, argv: list[str]) -> str:
    """click's usage error ``e`` as ``error: <message> (given: <value>); see `<command> --help```."""
    message = " ".join(e.format_message().split()).rstrip(".")
    param = getattr(e, "param", None)
    given = given_value(argv, list(param.opts)) if param is not None else None
    if given is not None:
        message += f" (given: {given!r})"
    where = e.ctx.command_path if e.ctx is not None else "pipeline"
    if e.ctx is None:  # an option without its value: click gives no context; the command words lead argv
        words = list(itertools.takewhile(lambda a: not a.startswith("-"), argv))[:2]  # `bench extract`
        where = " ".join(["pipeline", *words])
    return f"error: {message}; see `{where} --help`"
