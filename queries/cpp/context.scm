; Context for completions. Capture names: queries/README.md.

(function_definition
  body: (_) @body) @scope.function

[
  (class_specifier body: (_) @body)
  (struct_specifier body: (_) @body)
] @scope.class

; Only definitions with a body; `struct point p;` merely names one.
[
  (class_specifier name: (type_identifier) @name body: (_))
  (struct_specifier name: (type_identifier) @name body: (_))
  (union_specifier name: (type_identifier) @name body: (_))
  (enum_specifier name: (type_identifier) @name body: (_))
] @definition.type

(type_definition
  declarator: (type_identifier) @name) @definition.type

(alias_declaration
  name: (type_identifier) @name) @definition.type

[
  (preproc_include)
  (using_declaration)
] @import

(comment) @comment

[
  (string_literal)
  (raw_string_literal)
  (concatenated_string)
] @string
