; Context for completions. Capture names: queries/README.md.

[
  (function_declaration body: (_) @body)
  (generator_function_declaration body: (_) @body)
  (method_definition body: (_) @body)
] @scope.function

; Named function values: `const f = (x) => …`, `handler = () => …` in a class.
(variable_declarator
  value: [
    (arrow_function body: (_) @body)
    (function_expression body: (_) @body)
  ]) @scope.function

(field_definition
  value: [
    (arrow_function body: (_) @body)
    (function_expression body: (_) @body)
  ]) @scope.function

(class_declaration
  body: (_) @body) @scope.class

(class_declaration
  name: (_) @name) @definition.type

(import_statement) @import

(comment) @comment

[
  (string)
  (template_string)
] @string

(template_substitution) @string.interpolation
