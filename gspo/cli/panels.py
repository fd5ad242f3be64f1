"""Help grouped into sections: ``gspo serve``, ``gspo learn`` and ``gspo sft`` list their
options under the section comments of their config models (``# ------ batching``: the
``section`` of each option in ``gspo_rl.cli.options.generate()``), in the models' order, with
the options that are no field (``--config``, the log level, ``--help``) under "Options" first.

``panel_command(section)`` is the typer command class for one section of ``generate()``: it
changes only how ``--help`` is laid out (click's plain, wrapped format), never the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from typer.core import TyperCommand

if TYPE_CHECKING:  # the click that typer vendors: its commands get its Context
    from typer._click import Context, HelpFormatter


def panel_command(*sections: str, **extra: str) -> type[TyperCommand]:
    """A command class whose help groups the options of ``generate()[s]`` for each of
    ``sections`` by their section; ``extra``: more options (by name) and their section."""
    from gspo_rl.cli.options import generate

    spec = generate()
    titles = {flag: opt["section"] for s in sections for flag, opt in spec[s].items()}
    name = "".join(s.title() for s in sections[0].split("_"))
    return type(f"{name}Command", (_PanelCommand,), {"titles": titles | extra})


class _PanelCommand(TyperCommand):
    titles: dict[str, str] = {}

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = self.titles.get(param.name or "", "") or "Options"
            groups.setdefault(_title(title), []).append(record)
        for title, rows in groups.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _title(text: str) -> str:
    return text if text == "Options" else text[:1].upper() + text[1:]
