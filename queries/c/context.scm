; Context for completions. Capture names: queries/README.md.

(function_definition
  body: (_) @body) @scope.function

; Only definitions with a body; `struct point p;` merely names one.
[
  (struct_specifier name: (type_identifier) @name body: (_))
  (union_specifier name: (type_identifier) @name body: (_))
  (enum_specifier name: (type_identifier) @name body: (_))
] @definition.type

(type_definition
  declarator: (type_identifier) @name) @definition.type

(preproc_include) @import

(comment) @comment

[
  (string_literal)
  (concatenated_string)
] @string
