"""The connection layer shared by server and worker: one ``FrameStream`` (the
``asyncio.BufferedProtocol`` glue between a socket and a ``Channel``), connecting with
backoff, and the fault switch. It does the I/O that ``protocol/`` must not; it imports
``protocol/`` only, so that ``server/`` and ``client/`` both use it without importing
each other."""
