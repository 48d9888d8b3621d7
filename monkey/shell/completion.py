"""Shell completion for the one-shot CLI: `monkey completion bash|zsh` prints a script that
asks `monkey __complete WORD...` (the words typed so far, the last one being completed)
for candidates: commands, sub-commands, options and job ids."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

BASH = """\
# monkey completion for bash: eval "$(monkey completion bash)" (e.g. in ~/.bashrc)
_monkey() {
    local IFS=$'\\n'
    COMPREPLY=($(compgen -W "$(monkey __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null)" \\
        -- "${COMP_WORDS[COMP_CWORD]}"))
}
complete -o default -F _monkey monkey
"""

ZSH = """\
# monkey completion for zsh: eval "$(monkey completion zsh)" (e.g. in ~/.zshrc)
_monkey() {
    local -a items
    items=(${(f)"$(monkey __complete "${(@)words[2,CURRENT]}" 2>/dev/null)"})
    if (( ${#items} )); then
        compadd -a items
    else
        _files  # a command's own arguments (run -- python train.py), as bash's -o default
    fi
}
(( $+functions[compdef] )) || { autoload -Uz compinit && compinit; }
compdef _monkey monkey
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}
JOB_ARGS = ("job", "jobs", "after", "after_any")  # arguments that take job ids


def candidates(
    words: list[str],
    parsers: dict[str, Callable[..., argparse.ArgumentParser]],
    short_forms: list[str],
    recent_jobs: Callable[[], list[str]],
    actions: Mapping[str, Sequence[str]] = {},
) -> list[str]:  # noqa: B006
    """What may come at the last of WORDS (a partial word, maybe empty): commands, sub-commands,
    options, a positional's choices (`daemon start`), ACTIONS of a command whose first word is
    free (`sweep status`), then job ids where a JOB is taken. None after `--` (the job's own
    command: the shell completes files)."""
    *done, current = words or [""]
    if not done:
        return [c for c in [*parsers, *short_forms] if c.startswith(current)]
    if done[0] not in parsers or "--" in done:
        return []
    parser = parsers[done[0]]()
    for word in done[1:]:  # walk down sub-commands named so far
        sub = _subcommands(parser)
        if word in sub:
            parser = sub[word]
    positionals = [a for a in parser._actions if not a.option_strings]
    option = parser._option_string_actions.get(done[-1])
    if option is not None and option.dest in JOB_ARGS and not current.startswith("-"):
        return [c for c in ["last", *recent_jobs()] if c.startswith(current)]  # --juid JOB
    if current.startswith("-"):
        found = [o for o in parser._option_string_actions if o.startswith("--")]
    else:
        found = list(_subcommands(parser))
        for action in positionals:
            if (
                action.choices
                and not isinstance(action, argparse._SubParsersAction)
                and not set(done[1:]) & set(action.choices)
            ):
                found += list(action.choices)
        if done == [done[0]]:
            found += actions.get(done[0], ())
        if not found and any(a.dest in JOB_ARGS for a in positionals):
            found = ["last", *recent_jobs()]
    return [c for c in found if c.startswith(current)]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
