"""snet's wire protocol: messages, framing, the conversation (who may send what when),
the element layout and the job description.

Pure code with no I/O: no sockets, no asyncio, no file access. Both the server and the
worker import it; it imports neither. The I/O around it, for both sides, is in
``snet.transport``. The wire format is written down in README.md.
"""

PROTOCOL_VERSION = 1
