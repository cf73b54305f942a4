"""How the gateway is served: uvicorn with httptools, except that the requests the HTTP
parser refuses before the app sees them (a non-numeric Content-Length, a malformed request
line) are answered with an OpenAI error object, like every other error of the gateway."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.errors import error_body


class GatewayHttpProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = error_body(f"{msg} Check the request line, headers and Content-Length.", "invalid_request_error",
                          "invalid_http_request")
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()


# uvicorn.Config/run keywords for the gateway, shared by the CLI and the tests' servers.
UVICORN_OPTIONS = {"loop": "uvloop", "http": GatewayHttpProtocol, "access_log": False, "proxy_headers": False}
