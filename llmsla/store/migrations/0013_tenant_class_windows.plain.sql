-- Plain PostgreSQL: columns, primary keys and the roll-up trigger functions.
{{TENANT_CLASS_PLAIN}}
