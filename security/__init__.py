"""Trust in a Megha federation: who may say what, and how a receiver knows.

The operator is trusted; users are not; the network between hosts is not
(docs/security.md has the threat model and the table of refusals). Each module
is a small building block with no I/O of its own unless its name says so:

* ``identity``   -- who a party is (``gm:gm0``, ``lm:lm1``, ``user:alice``).
* ``secret``     -- the federation secret file and the keys derived from it.
* ``signing``    -- signed internal HTTP calls, replay cache, access policy.
* ``sealing``    -- authenticated broker messages (sender, epoch, seq, MAC).
* ``tokens``     -- per-user submission tokens, stored hashed, revocable.
* ``broker_acl`` -- one RabbitMQ vhost per federation, one broker user per party.
* ``sandbox``    -- task commands, when the operator allows them.
* ``files``      -- private (0600) files written atomically.
"""
