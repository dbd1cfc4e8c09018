"""``megha dashboard``: a live web page of a running federation.

``aggregate`` turns the services' ``/v1/state`` pages, polled once a second, into
what the page shows (pure: no event loop, no clock); ``server`` polls the services
(signing as the operator) and pushes snapshots to the page with server-sent events;
``static/`` is the page itself (no CDN: it is shipped in the package).
"""
