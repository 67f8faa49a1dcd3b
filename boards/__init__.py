"""Board platforms and top-levels; `python -m boards.<name>` builds one."""
