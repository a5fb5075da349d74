; Context for completions. Capture names: queries/README.md.

(function_item
  body: (_) @body) @scope.function

(impl_item
  body: (_) @body) @scope.class

(trait_item
  body: (_) @body) @scope.class

(struct_item
  name: (type_identifier) @name) @definition.type

(enum_item
  name: (type_identifier) @name) @definition.type

(union_item
  name: (type_identifier) @name) @definition.type

(trait_item
  name: (type_identifier) @name) @definition.type

(type_item
  name: (type_identifier) @name) @definition.type

[
  (use_declaration)
  (extern_crate_declaration)
] @import

[
  (line_comment)
  (block_comment)
] @comment

[
  (string_literal)
  (raw_string_literal)
] @string
