; Context for completions. Capture names: queries/README.md.

[
  (method_declaration body: (_) @body)
  (constructor_declaration body: (_) @body)
] @scope.function

[
  (class_declaration body: (_) @body)
  (interface_declaration body: (_) @body)
  (enum_declaration body: (_) @body)
  (record_declaration body: (_) @body)
] @scope.class

[
  (class_declaration name: (identifier) @name)
  (interface_declaration name: (identifier) @name)
  (enum_declaration name: (identifier) @name)
  (record_declaration name: (identifier) @name)
  (annotation_type_declaration name: (identifier) @name)
] @definition.type

(import_declaration) @import

[
  (line_comment)
  (block_comment)
] @comment

(string_literal) @string
