; Definitions for the workspace index. Capture names: queries/README.md.
(function_definition
  name: (identifier) @name
  body: (_) @body) @definition.function
(class_definition
  name: (identifier) @name
  body: (_) @body) @definition.type
; Module constants and class attributes: `NAME = …`, `name: int = …`.
(module
  (expression_statement
    (assignment left: (identifier) @name) @definition.constant))
(class_definition
  body: (block
    (expression_statement
      (assignment left: (identifier) @name) @definition.field)))
; `self.name = …` in a method: an instance field.
(assignment
  left: (attribute
    object: (identifier) @_self
    attribute: (identifier) @name)
  (#eq? @_self "self")) @definition.field
