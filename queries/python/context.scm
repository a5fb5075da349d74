; Context for completions. Capture names: queries/README.md.

(function_definition
  body: (_) @body) @scope.function

(class_definition
  body: (_) @body) @scope.class

(class_definition
  name: (identifier) @name) @definition.type

[
  (import_statement)
  (import_from_statement)
  (future_import_statement)
] @import

(comment) @comment

(string) @string

(interpolation) @string.interpolation
