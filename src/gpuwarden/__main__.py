"""The `gpuwarden` command's entry (the console script and `python -m gpuwarden`).

`check` with arguments that checkopts parses for certain runs without importing click: a check's cost
is mostly what it imports (docs/performance.md, issue 34). Everything else, and any `check` whose
arguments this fast path leaves alone (help, an error, an unusual form), goes through click (cli),
which says usage errors in its own words.
"""

from __future__ import annotations

import sys


def main() -> None:
    from gpuwarden import checkrun

    checkrun.reader_safe_stdout()  # `gpuwarden ... | head -1`: a closed pipe is no error (checkrun says why)
    args = sys.argv[1:]
    if args[:1] == ["check"]:
        from gpuwarden import checkopts

        params = checkopts.parse(args[1:])
        if params is not None:
            checkrun.startup()
            try:
                checkrun.check(**params)
            except checkrun.UsageError:
                pass  # nothing was read or written yet: click parses again and says it as it says its own
    from gpuwarden.cli import main as click_main

    click_main()


if __name__ == "__main__":
    main()
