"""URLs fit for messages and reports: credentials and query strings cut off.

Its own module because both the client and the transport guard quote URLs, and the client is built on the guard.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def strip_userinfo(url: str) -> str:
    """The URL without ``user:password@``."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def display_url(url: str) -> str:
    """A URL fit for a message: no userinfo, no query string (keys sometimes travel as ``?api_key=``)."""
    return strip_userinfo(url).split("?", 1)[0]
