"""The feed's domain in plain Python and lxml, with no Dagster and no Spark: parsing and
validating a message (messages, schema, limits), splitting it into items (items), RFC 5261
patches and their XPath selectors (xmlpatch, xpath, patchscope), JMS selectors (selector), the
reference fold of one master and the serial reference pipeline (fold, pipeline), the
interpreted model (interpret) and the reason codes (reasons). The Spark transforms run this
same code in their Python workers (docs/design.md, "Layers and the direction of imports")."""
