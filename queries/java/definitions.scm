; Definitions for the workspace index. Capture names: queries/README.md.
[
  (method_declaration name: (identifier) @name body: (_)? @body)
  (constructor_declaration name: (identifier) @name body: (_) @body)
] @definition.function
[
  (class_declaration name: (identifier) @name body: (_) @body)
  (interface_declaration name: (identifier) @name body: (_) @body)
  (enum_declaration name: (identifier) @name body: (_) @body)
  (record_declaration name: (identifier) @name body: (_) @body)
  (annotation_type_declaration name: (identifier) @name body: (_) @body)
] @definition.type
(field_declaration
  declarator: (variable_declarator name: (identifier) @name)) @definition.field
(constant_declaration
  declarator: (variable_declarator name: (identifier) @name)) @definition.constant
(enum_constant
  name: (identifier) @name) @definition.constant
