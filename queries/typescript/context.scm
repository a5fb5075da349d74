; Context for completions. Capture names: queries/README.md.
; tsx/context.scm inherits this file.

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

(public_field_definition
  value: [
    (arrow_function body: (_) @body)
    (function_expression body: (_) @body)
  ]) @scope.function

[
  (class_declaration body: (_) @body)
  (abstract_class_declaration body: (_) @body)
  (interface_declaration body: (_) @body)
] @scope.class

[
  (class_declaration name: (_) @name)
  (abstract_class_declaration name: (_) @name)
  (interface_declaration name: (_) @name)
  (type_alias_declaration name: (_) @name)
  (enum_declaration name: (_) @name)
] @definition.type

(import_statement) @import

(comment) @comment

[
  (string)
  (template_string)
] @string

(template_substitution) @string.interpolation
