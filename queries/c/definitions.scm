; Definitions for the workspace index. Capture names: queries/README.md.
(function_definition
  declarator: (function_declarator declarator: (identifier) @name)
  body: (_) @body) @definition.function
(function_definition
  declarator: (pointer_declarator
    declarator: (function_declarator declarator: (identifier) @name))
  body: (_) @body) @definition.function
; Prototypes in headers.
(declaration
  declarator: (function_declarator declarator: (identifier) @name)) @definition.function
(declaration
  declarator: (pointer_declarator
    declarator: (function_declarator declarator: (identifier) @name))) @definition.function
[
  (struct_specifier name: (type_identifier) @name body: (_) @body)
  (union_specifier name: (type_identifier) @name body: (_) @body)
  (enum_specifier name: (type_identifier) @name body: (_) @body)
] @definition.type
(type_definition
  declarator: (type_identifier) @name) @definition.type
(field_declaration
  declarator: [
    (field_identifier) @name
    (pointer_declarator declarator: (field_identifier) @name)
    (array_declarator declarator: (field_identifier) @name)
  ]) @definition.field
(enumerator
  name: (identifier) @name) @definition.constant
(preproc_def
  name: (identifier) @name) @definition.constant
(preproc_function_def
  name: (identifier) @name) @definition.function
