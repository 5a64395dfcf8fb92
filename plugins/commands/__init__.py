"""Built-in sub-commands, each a :class:`traceparse.command.Command` registered by its own entry point.

``core/`` holds the commands every session uses (``ingest``, ``analyze``, ``list``, ``show``, ``rm``,
``rules``, ``formats``, ``plugins``, ``export``); ``compare``, ``diff``, ``roofline`` and ``flops``
are one module each (``predict`` is its own package, ``traceparse_plugins.predict``).
"""
