; Definitions for the workspace index. Capture names: queries/README.md.
; tsx/definitions.scm inherits this file.
[
  (function_declaration name: (_) @name body: (_) @body)
  (generator_function_declaration name: (_) @name body: (_) @body)
  (method_definition name: (_) @name body: (_) @body)
  (function_signature name: (_) @name)
  (method_signature name: (_) @name)
  (abstract_method_signature name: (_) @name)
] @definition.function
(variable_declarator
  name: (identifier) @name
  value: [
    (arrow_function body: (_) @body)
    (function_expression body: (_) @body)
  ]) @definition.function
[
  (class_declaration name: (_) @name body: (_) @body)
  (abstract_class_declaration name: (_) @name body: (_) @body)
  (interface_declaration name: (_) @name body: (_) @body)
  (enum_declaration name: (_) @name body: (_) @body)
  (type_alias_declaration name: (_) @name)
] @definition.type
[
  (public_field_definition name: (_) @name)
  (property_signature name: (_) @name)
] @definition.field
(program
  [
    (lexical_declaration (variable_declarator name: (identifier) @name) @definition.constant)
    (export_statement
      (lexical_declaration (variable_declarator name: (identifier) @name) @definition.constant))
  ])
