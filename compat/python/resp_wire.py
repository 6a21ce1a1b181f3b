"""A plain RESP2/RESP3 client that keeps every reply's wire type.

Client libraries turn replies into friendly values (a status reply and a bulk string both
become `str`, a null array and a null bulk both become `None`), which hides exactly the
differences a comparison with a real Redis has to see. This client keeps them: each reply
becomes a tagged tuple such as ("+", "OK"), ("$", "text"), (":", 3), ("*", [...]),
("%", [(key, value), ...]) or ("_",) for RESP3's null.
"""

import socket


class WireError(Exception):
    pass


class Wire:
    def __init__(self, port, host="127.0.0.1", timeout=30):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""

    def close(self):
        self.sock.close()

    def call(self, *args):
        """Sends one command and returns its reply, tagged."""
        self.send(*args)
        return self.reply()

    def send(self, *args):
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(f"${len(data)}\r\n".encode() + data + b"\r\n")
        self.sock.sendall(b"".join(parts))

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise WireError("connection closed")
        self.buffer += chunk

    def _line(self):
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line.decode()

    def _exact(self, n):
        while len(self.buffer) < n + 2:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n + 2 :]
        return data.decode()

    def reply(self):
        line = self._line()
        kind, rest = line[0], line[1:]
        if kind in "+-":
            return (kind, rest)
        if kind == ":":
            return (":", int(rest))
        if kind == ",":
            return (",", rest)
        if kind == "#":
            return ("#", rest == "t")
        if kind == "_":
            return ("_",)
        if kind in "$=!":
            n = int(rest)
            return (kind, None) if n < 0 else (kind, self._exact(n))
        if kind in "*~>":
            n = int(rest)
            return (kind, None) if n < 0 else (kind, [self.reply() for _ in range(n)])
        if kind in "%|":
            n = int(rest)
            return (kind, [(self.reply(), self.reply()) for _ in range(n)])
        raise WireError(f"unexpected reply line {line!r}")
