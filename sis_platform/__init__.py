"""sis-platform: consume the SIS Sportsdata feed, keep every master document current, and hand
the interpreted model to Opportunity Management (docs/design.md)."""
