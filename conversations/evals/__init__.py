"""Test sets: questions an assistant should answer well, run as real turns against its live
configuration and a draft of its next one, scored by deterministic checks, so that a change
goes live on evidence (``runs``), and a draft is promoted or rolled back in one action
(``drafts``)."""
