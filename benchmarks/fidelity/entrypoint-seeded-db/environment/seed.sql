CREATE TABLE tickets (id INTEGER PRIMARY KEY, title TEXT, status TEXT, assignee TEXT);
INSERT INTO tickets VALUES
  (1, 'Login page times out', 'open', 'mira'),
  (2, 'Export drops last row', 'closed', 'mira'),
  (3, 'Typo in footer', 'open', 'jonas'),
  (4, 'Slow search', 'open', 'mira'),
  (5, 'Broken avatar upload', 'in_review', 'jonas'),
  (6, 'Dark mode contrast', 'open', 'aiko'),
  (7, 'Old API removal', 'closed', 'aiko'),
  (8, 'CSV encoding', 'open', 'mira');
