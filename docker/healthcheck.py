"""The image's HEALTHCHECK: exit 0 when GET /health answers 200, 1 otherwise (503 while loading, no answer).

Python's standard library only, so the image needs no curl: `python healthcheck.py [URL]`.
"""

import sys
import urllib.error
import urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/health"
try:
    with urllib.request.urlopen(url, timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except (urllib.error.URLError, OSError) as e:  # HTTPError (a 503) is a URLError
    print(f"unhealthy: {url}: {e}", file=sys.stderr)
    sys.exit(1)
