; Definitions for the workspace index. Capture names: queries/README.md.
[
  (function_declaration name: (_) @name body: (_) @body)
  (generator_function_declaration name: (_) @name body: (_) @body)
  (method_definition name: (_) @name body: (_) @body)
] @definition.function
(variable_declarator
  name: (identifier) @name
  value: [
    (arrow_function body: (_) @body)
    (function_expression body: (_) @body)
  ]) @definition.function
(class_declaration
  name: (_) @name
  body: (_) @body) @definition.type
(field_definition
  property: (_) @name) @definition.field
(program
  [
    (lexical_declaration (variable_declarator name: (identifier) @name) @definition.constant)
    (export_statement
      (lexical_declaration (variable_declarator name: (identifier) @name) @definition.constant))
  ])
