; Definitions for the workspace index. Capture names: queries/README.md.
(function_item
  name: (identifier) @name
  body: (_) @body) @definition.function
(function_signature_item
  name: (identifier) @name) @definition.function
[
  (struct_item name: (type_identifier) @name body: (_)? @body)
  (enum_item name: (type_identifier) @name body: (_) @body)
  (union_item name: (type_identifier) @name body: (_) @body)
  (trait_item name: (type_identifier) @name body: (_) @body)
  (type_item name: (type_identifier) @name)
] @definition.type
(field_declaration
  name: (field_identifier) @name) @definition.field
(enum_variant
  name: (identifier) @name) @definition.field
[
  (const_item name: (identifier) @name)
  (static_item name: (identifier) @name)
] @definition.constant
