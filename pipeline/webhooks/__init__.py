"""Signed HTTP deliveries, at least once: webhooks on run events, and the delivery core they share.

* :mod:`.deliverer` — the loop that sends what the replay log's outbox
  (``runwire.store.outbox``) holds, retries it on a schedule and disables a
  channel that keeps failing: "deliver this JSON body to this URL, signed
  with this secret, durably, at least once", for anything that queues a
  ``Delivery``.
* :mod:`.sender` — one attempt (httpcore, no redirects, bounded reads and time);
  :mod:`.targets` — which addresses a delivery may reach (SSRF);
  :mod:`.signing` — Standard Webhooks signatures and secrets.
* :mod:`.notify` — run notices as Standard Webhooks bodies for the webhooks that
  want them; :mod:`.subscriptions` — a webhook as the API makes and shows it.
"""
