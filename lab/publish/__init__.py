"""Publishing: the log pages, the book's chapter copies and the tables chapters show, made from outputs/.

Nothing here imports torch (tests/book/test_publish.py runs it with torch blocked): the log and the book build
on any machine, from session folders carried back from a GPU.

- log: `python -m lab log`, writes every page and chapter copy;
- pages: reading sessions, escaping untrusted text, Markdown tables;
- chapters: which session's executed copy each chapter page shows;
- baselines, pivot: ratios to every SDPA backend per GPU and kernel family;
- standings: the front page's table, every family against its SDPA yardstick;
- prune: the tree budget (which sessions keep their executed copies);
- ledger: the bugs and patterns pages;
- tables: the tables chapters display.
"""
