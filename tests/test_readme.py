"""README.md tells the truth about the CLI: one command table, each command once, and every
command and option it names exists, and the reverse (tests/readme_table.py reads both)."""

from __future__ import annotations

from tests.readme_table import (
    GLOBAL_OPTIONS,
    HIDDEN,
    README,
    command_rows,
    leaves,
    options,
    row_commands,
    tables,
    tokens,
)


def test_the_command_table_is_one_table_with_each_command_once() -> None:
    heads = [[c[-1] for c in t[0]] for t in tables()]
    assert heads.count(["\0command", "\0what it does"]) == 1, heads
    # A table cut by a blank line goes on as paragraphs of raw `| ... |` text.
    raw = [
        t.content.splitlines()[0]
        for t in tokens()
        if t.type == "inline" and t.content.lstrip().startswith("|")
    ]
    assert not raw, f"README has table rows outside a table: {raw}"
    parsers = leaves()
    seen: dict[str, str] = {}
    for row in command_rows():
        commands = row_commands(row, parsers)
        assert commands, f"README's row `{row.forms[0]}` names no monkey command"
        for command in commands:
            assert command not in seen, (
                f"`{command}` has two rows: `{seen[command]}`, `{row.forms[0]}`"
            )
            seen[command] = row.forms[0]
    missing = sorted(set(parsers) - set(seen))
    assert not missing, f"commands missing from README's table: {missing}"


def test_every_option_in_the_table_exists_and_every_option_is_in_the_table() -> None:
    parsers = leaves()
    problems = []
    for row in command_rows():
        for command in row_commands(row, parsers):
            known = {o for strings in options(parsers[command]) for o in strings}
            problems += [
                f"README: `{command} {flag}` is no option of it"
                for flag in sorted(row.flags - known)
            ]
            for strings in options(parsers[command]):
                longs = [o for o in strings if o.startswith("--")]
                if set(strings) & set(GLOBAL_OPTIONS) or (command, (longs or strings)[0]) in HIDDEN:
                    continue
                if not set(strings) & row.flags:
                    problems.append(f"`{command} {'/'.join(strings)}` is not in README's row")
    assert not problems, "\n".join(problems)


def test_options_documented_once_for_all_and_hidden_ones_have_reasons() -> None:
    text = README.read_text()
    for option, where in GLOBAL_OPTIONS.items():
        assert where in text, f"README never says {where} (for {option})"
    parsers = leaves()
    for (command, option), reason in HIDDEN.items():
        assert reason and any(option in s for s in options(parsers[command])), (command, option)
        assert option not in {
            f for r in command_rows() for f in r.flags if command in row_commands(r, parsers)
        }, f"{option} is documented"
