; Definitions for the workspace index. Capture names: queries/README.md.
[
  (function_declaration name: (_) @name body: (_) @body)
  (method_declaration name: (_) @name body: (_) @body)
] @definition.function
(method_elem
  name: (_) @name) @definition.function
[
  (type_spec name: (type_identifier) @name type: (_) @body)
  (type_alias name: (type_identifier) @name)
] @definition.type
(field_declaration
  name: (field_identifier) @name) @definition.field
[
  (const_spec name: (identifier) @name)
  (var_spec name: (identifier) @name)
] @definition.constant
