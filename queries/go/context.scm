; Context for completions. Capture names: queries/README.md.

[
  (function_declaration body: (_) @body)
  (method_declaration body: (_) @body)
] @scope.function

; `type Point struct {…}`: the whole declaration, keyword included.
(type_declaration
  .
  [
    (type_spec name: (type_identifier) @name)
    (type_alias name: (type_identifier) @name)
  ]
  .) @definition.type

; `type ( A int; B string )`: each spec of a group on its own.
(type_declaration
  "("
  [
    (type_spec name: (type_identifier) @name)
    (type_alias name: (type_identifier) @name)
  ] @definition.type)

(import_declaration) @import

(comment) @comment

[
  (interpreted_string_literal)
  (raw_string_literal)
] @string
